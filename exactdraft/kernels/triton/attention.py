"""Row-invariant causal grouped-query attention over a KV cache, as two Triton kernels.

Invariant: the output for query row m and head h depends only on q[m, h], the row's absolute
position p and the cache entries it may see (keys j <= p, and p - j < window when window > 0);
not on the number of query rows, the other rows' positions, the cache capacity or what the cache
holds beyond p. Prefill, decode and verify run this same code, so a prompt row, a verify row and
a decode row at one position get the same bits. The argument:
- keys are cut into CHUNK-key chunks aligned to absolute positions (chunk c holds keys
  [c * CHUNK, (c + 1) * CHUNK)), and chunks into TILE-key tiles, also aligned. The number of
  chunks a launch covers follows from the positions, never a fixed split count;
- the chunk kernel computes, for each (row, head, chunk), an fp32 online softmax over the chunk's
  tiles in order. A program handles a block of rows and walks the tiles any of them may see; a
  tile in which a row sees no key leaves that row's running max, sum and accumulator untouched
  (a `where`, not arithmetic with zeros), so extra tiles walked for other rows change nothing;
  in a tile where the row sees some keys, its scores, maximum, exponentials and sums are
  computed per element from its own data and the tile, with invisible keys weighted by exact
  zeros;
- the merge kernel, one program per row (all its heads, elementwise), combines exactly the
  chunks from the row's first visible key to its own position, in chunk order;
- invisible keys enter p.v as 0 * v, a zero whose sign follows v; that sign can only surface
  when a row's whole sum is zero, so the last step stores every zero as +0.0;
- with sinks (one logit per query head, backends/sinks.py), the merge starts from the sink
  (max = sink, sum = 1, accumulator 0) and merges every chunk into it, the first included:
  the sink's place in the order is fixed, before the keys, as in the C kernels.
The dot steps (q.k and p.v) are either tl.dot or a rowwise reduction (see launch.DOT_MODES);
the block shape is fixed per head layout (group size, head dim) and dtype, never per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from exactdraft.kernels.triton.launch import (
    PINNED_OPTIONS,
    KernelError,
    aligned,
    check_device,
    dtype_name,
    next_power_of_2,
    rowwise_dot,
)
from exactdraft.kernels.triton.rounding import round_to_dtype

CHUNK = 512
TILE = 64
# Scratch for chunk partials is bounded by launching at most this many float32 values at once;
# rows are independent, so cutting a pass into row slices cannot change any row's bits.
MAX_SCRATCH_VALUES = 1 << 26


@dataclass(frozen=True)
class AttentionConfig:
    """One compiled variant per (group size, head dim, dtype, device type)."""

    block_m: int
    group: int
    chunk: int = CHUNK
    tile: int = TILE
    num_warps: int = 4


def attention_config(group: int, head_dim: int, dtype: str, device_type: str) -> AttentionConfig:
    """Query rows per program: enough that rows x group heads fill a 16-row dot tile."""
    del head_dim, dtype, device_type  # one shape serves all of them today
    padded_group = next_power_of_2(group)
    return AttentionConfig(block_m=max(1, 16 // padded_group), group=padded_group)


@triton.jit(do_not_specialize=["M", "capacity", "num_chunks", "window"])
def _chunk_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, max_ptr, sum_ptr, acc_ptr,
                  M, capacity, num_chunks, window, scale,
                  HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PADDED: tl.constexpr,
                  D: tl.constexpr, D_PADDED: tl.constexpr, BLOCK_M: tl.constexpr,
                  CHUNK: tl.constexpr, TILE: tl.constexpr, ROWWISE: tl.constexpr,
                  IEEE_FP32: tl.constexpr):
    kv_head = tl.program_id(1)
    chunk = tl.program_id(2)
    # Local row r is query (block start + r // GROUP_PADDED), head member r % GROUP_PADDED.
    local = tl.arange(0, BLOCK_M * GROUP_PADDED)
    query = tl.program_id(0) * BLOCK_M + local // GROUP_PADDED
    member = local % GROUP_PADDED
    head = kv_head * GROUP + member
    live = (query < M) & (member < GROUP)
    position = tl.load(pos_ptr + query, mask=live, other=-1)
    first_key = tl.where(window > 0, tl.maximum(position - window + 1, 0), 0)
    dims = tl.arange(0, D_PADDED)
    dim_mask = dims < D
    q = tl.load(q_ptr + (query.to(tl.int64) * HEADS + head)[:, None] * D + dims[None, :],
                mask=live[:, None] & dim_mask[None, :], other=0.0)
    row_max = tl.full((BLOCK_M * GROUP_PADDED,), float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M * GROUP_PADDED,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M * GROUP_PADDED, D_PADDED), dtype=tl.float32)
    lowest = tl.min(tl.where(live, first_key, capacity), axis=0)
    highest = tl.max(position, axis=0)
    start = tl.maximum(chunk * CHUNK, lowest // TILE * TILE)
    stop = tl.minimum((chunk + 1) * CHUNK, highest + 1)
    keys_base = kv_head.to(tl.int64) * capacity * D
    tile_keys = tl.arange(0, TILE)
    for tile_start in range(start, stop, TILE):
        keys = tile_start + tile_keys
        kv_offsets = keys_base + keys.to(tl.int64)[:, None] * D + dims[None, :]
        kv_mask = (keys[:, None] < capacity) & dim_mask[None, :]
        k = tl.load(k_ptr + kv_offsets, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_offsets, mask=kv_mask, other=0.0)
        if ROWWISE:
            scores = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        elif IEEE_FP32:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        visible = (keys[None, :] <= position[:, None]) & (keys[None, :] >= first_key[:, None])
        scores = tl.where(visible, scores * scale, float("-inf"))
        tile_max = tl.max(scores, axis=1)
        seen = tile_max > float("-inf")
        new_max = tl.where(seen, tl.maximum(row_max, tile_max), row_max)
        # Rows that see nothing here subtract 0 - 0 and keep every value as it was.
        shift = tl.where(seen, new_max, 0.0)
        rescale = tl.exp(tl.where(seen, row_max, 0.0) - shift)
        weights = tl.exp(scores - shift[:, None])
        if ROWWISE:
            mixed = tl.sum(weights[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        elif IEEE_FP32:
            mixed = tl.dot(weights, v, input_precision="ieee")
        else:
            mixed = tl.dot(weights.to(v.dtype), v)
        row_sum = tl.where(seen, row_sum * rescale + tl.sum(weights, axis=1), row_sum)
        acc = tl.where(seen[:, None], acc * rescale[:, None] + mixed, acc)
        row_max = new_max
    slot = (query.to(tl.int64) * HEADS + head) * num_chunks + chunk
    tl.store(max_ptr + slot, row_max, mask=live)
    tl.store(sum_ptr + slot, row_sum, mask=live)
    tl.store(acc_ptr + slot[:, None] * D + dims[None, :], acc,
             mask=live[:, None] & dim_mask[None, :])


@triton.jit(do_not_specialize=["num_chunks", "window"])
def _merge_kernel(pos_ptr, max_ptr, sum_ptr, acc_ptr, out_ptr, sink_ptr, num_chunks, window,
                  HEADS: tl.constexpr, HEADS_PADDED: tl.constexpr, D: tl.constexpr,
                  D_PADDED: tl.constexpr, CHUNK: tl.constexpr, HAS_SINKS: tl.constexpr):
    # One program per query row, all its heads at once; every step is elementwise per head.
    query = tl.program_id(0)
    position = tl.load(pos_ptr + query)
    first_key = tl.where(window > 0, tl.maximum(position - window + 1, 0), 0)
    first = first_key // CHUNK
    heads = tl.arange(0, HEADS_PADDED)
    dims = tl.arange(0, D_PADDED)
    head_mask = heads < HEADS
    mask = head_mask[:, None] & (dims < D)[None, :]
    rows = query.to(tl.int64) * HEADS + heads
    if HAS_SINKS:
        total_max = tl.load(sink_ptr + heads, mask=head_mask, other=0.0)
        total_sum = tl.full((HEADS_PADDED,), 1.0, tl.float32)
        acc = tl.zeros((HEADS_PADDED, D_PADDED), dtype=tl.float32)
        begin = first
    else:
        slots = rows * num_chunks + first
        total_max = tl.load(max_ptr + slots, mask=head_mask, other=0.0)
        total_sum = tl.load(sum_ptr + slots, mask=head_mask, other=1.0)
        acc = tl.load(acc_ptr + slots[:, None] * D + dims[None, :], mask=mask, other=0.0)
        begin = first + 1
    for chunk in range(begin, position // CHUNK + 1):
        slots = rows * num_chunks + chunk
        chunk_max = tl.load(max_ptr + slots, mask=head_mask, other=0.0)
        new_max = tl.maximum(total_max, chunk_max)
        old_weight = tl.exp(total_max - new_max)
        new_weight = tl.exp(chunk_max - new_max)
        chunk_sum = tl.load(sum_ptr + slots, mask=head_mask, other=1.0)
        total_sum = total_sum * old_weight + chunk_sum * new_weight
        chunk_acc = tl.load(acc_ptr + slots[:, None] * D + dims[None, :], mask=mask, other=0.0)
        acc = acc * old_weight[:, None] + chunk_acc * new_weight[:, None]
        total_max = new_max
    out = tl.div_rn(acc, total_sum[:, None])
    out = tl.where(out == 0.0, 0.0, out)  # -0.0 and +0.0 compare equal; store +0.0
    tl.store(out_ptr + rows[:, None] * D + dims[None, :],
             round_to_dtype(out, out_ptr.dtype.element_ty), mask=mask)


def attention(q: Any, k_cache: Any, v_cache: Any, q_positions: Any, scale: float,
              window: int = 0, *, dot: str = "auto", rows_per_launch: int | None = None,
              config: AttentionConfig | None = None, sinks: Any = None) -> Any:
    """Causal grouped-query attention of q [M, Hq, D] at absolute `q_positions` [M] over the
    caches [Hkv, capacity, D]; returns [M, Hq, D] in q's dtype.

    A query at p sees keys j <= p (and p - j < window if window > 0); the caller must have
    written keys 0..p. `rows_per_launch` caps the rows per launch (default: by scratch size);
    `config` overrides the head layout's configuration (tests use small chunks and tiles).
    `sinks` (float32 [Hq], or None) are the heads' sink logits, merged before the keys.
    """
    import torch

    if q.dim() != 3 or k_cache.dim() != 3 or tuple(v_cache.shape) != tuple(k_cache.shape):
        raise KernelError(f"attention needs q [M, Hq, D] and two caches [Hkv, capacity, D], got "
                          f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    rows, heads, head_dim = q.shape
    kv_heads, capacity, cache_dim = k_cache.shape
    if cache_dim != head_dim or heads % kv_heads:
        raise KernelError(f"q has {heads} heads of size {head_dim}, the caches {kv_heads} heads "
                          f"of size {cache_dim}; need equal sizes and Hq a multiple of Hkv")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise KernelError(f"q, keys and values must share one dtype, got {q.dtype}, "
                          f"{k_cache.dtype}, {v_cache.dtype}")
    if not isinstance(window, int) or window < 0:
        raise KernelError(f"window must be a non-negative int, got {window!r}")
    dtype = dtype_name(q)
    device_type = check_device(_chunk_kernel, q, k_cache, v_cache)
    # Checked on the host: positions usually arrive as a numpy array, and reading the bounds
    # of a device tensor would wait for the device.
    host_positions = torch.as_tensor(q_positions).reshape(-1).cpu()
    if host_positions.numel() != rows:
        raise KernelError(f"{host_positions.numel()} positions given for {rows} query rows")
    out = torch.empty_like(q)
    if rows == 0:
        return out
    low, high = int(host_positions.min()), int(host_positions.max())
    if low < 0 or high >= capacity:
        bad = low if low < 0 else high
        raise KernelError(f"query position {bad} is outside the cache of {capacity} positions")
    positions = host_positions.to(device=q.device, dtype=torch.int32)
    if sinks is not None:
        sinks = torch.as_tensor(sinks).to(device=q.device, dtype=torch.float32).contiguous()
        if tuple(sinks.shape) != (heads,):
            raise KernelError(f"sinks must have shape ({heads},), got {tuple(sinks.shape)}")
    config = config or attention_config(heads // kv_heads, head_dim, dtype, device_type)
    block_rows = config.block_m * config.group
    if config.group < heads // kv_heads or config.chunk % config.tile \
            or block_rows & (block_rows - 1) or config.group & (config.group - 1):
        raise KernelError(f"{config} does not fit {heads // kv_heads} heads per group, or its "
                          "chunk is not whole tiles, or its row block is not a power of two")
    q, k_cache, v_cache = aligned(q), aligned(k_cache), aligned(v_cache)
    num_chunks = high // config.chunk + 1
    if rows_per_launch is None:
        per_row = heads * num_chunks * (head_dim + 2)
        rows_per_launch = max(config.block_m, MAX_SCRATCH_VALUES // per_row)
    for begin in range(0, rows, rows_per_launch):
        end = min(rows, begin + rows_per_launch)
        _attend_rows(q[begin:end], k_cache, v_cache, aligned(positions[begin:end]),
                     out[begin:end], scale, window, num_chunks, config,
                     rowwise_dot(dot, _chunk_kernel), dtype == "float32", sinks)
    return out


def _attend_rows(q: Any, k_cache: Any, v_cache: Any, positions: Any, out: Any, scale: float,
                 window: int, num_chunks: int, config: AttentionConfig, rowwise: bool,
                 ieee_fp32: bool, sinks: Any = None) -> None:
    import torch

    rows, heads, head_dim = q.shape
    kv_heads, capacity, _ = k_cache.shape
    scratch = dict(dtype=torch.float32, device=q.device)
    maxima = torch.empty((rows, heads, num_chunks), **scratch)
    sums = torch.empty((rows, heads, num_chunks), **scratch)
    partials = torch.empty((rows, heads, num_chunks, head_dim), **scratch)
    padded_dim = next_power_of_2(head_dim)
    grid = (triton.cdiv(rows, config.block_m), kv_heads, num_chunks)
    _chunk_kernel[grid](
        aligned(q), k_cache, v_cache, positions, maxima, sums, partials,
        rows, capacity, num_chunks, window, float(scale),
        HEADS=heads, GROUP=heads // kv_heads, GROUP_PADDED=config.group, D=head_dim,
        D_PADDED=padded_dim, BLOCK_M=config.block_m, CHUNK=config.chunk, TILE=config.tile,
        ROWWISE=rowwise, IEEE_FP32=ieee_fp32, num_warps=config.num_warps, **PINNED_OPTIONS,
    )
    merged = torch.empty_like(q) if out.data_ptr() % 16 else out
    _merge_kernel[(rows,)](
        positions, maxima, sums, partials, merged, maxima if sinks is None else sinks,
        num_chunks, window, HEADS=heads, HEADS_PADDED=next_power_of_2(heads), D=head_dim,
        D_PADDED=padded_dim, CHUNK=config.chunk, HAS_SINKS=sinks is not None, num_warps=4,
        **PINNED_OPTIONS,
    )
    if merged is not out:
        out.copy_(merged)
