"""The recurrent layers of the hybrid families (Gated DeltaNet, Mamba-2) split by head group
across tensor-parallel ranks: each rank projects, runs and holds only its own heads; the ranks
gather the heads' outputs (in head order) before the out projection.

Invariant: TP=N writes the bits TP=1 writes. The rank's rows of the input projection (its
heads' channels, and the key heads or B, C groups they read) are whole dot products computed
locally (sharding.py's rule, as heads.py does for q, k, v). Everything between the projections
is host arithmetic that is elementwise per channel or reduces within one head or one norm group
(recurrent.py: the causal convolution per channel, silu, the decays per head, l2 norms per key
head, the scans' tree_sums over the key or state dimension per head, the gated RMS norm per
value head or per Mamba-2 group), so a rank that owns whole heads (and, for Mamba-2, whole norm
groups) computes each of its elements with exactly TP=1's arithmetic: the model's own layer
code runs unchanged on a copy of the layer holding the rank's parameters. The gather of the
normed head outputs is a copy, and the out projection computes whole columns (backend.py). A
rank holds 1/N of each split layer's convolution and recurrent state; rollback restores the
rank's own snapshots (state.py), and replays run on every rank (target.py), so every rank
rolls back alike.

A layer is split when N divides its value heads (Gated DeltaNet; and each rank's value heads
read whole key heads, or lie within one key head's group) or its heads and norm groups
(Mamba-2, whose gated norm spans a group of heads). Otherwise that layer runs whole on every
rank from its gathered projection: the same bits, without the split.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from exactdraft.formats.table import stack_rows
from exactdraft.models.gated_deltanet import GatedDeltaNet
from exactdraft.models.mamba2 import Mamba2
from exactdraft.parallel.heads import GatheredInput
from exactdraft.parallel.sharding import weight_rows


def deltanet_splits(layer: GatedDeltaNet, world_size: int) -> bool:
    hk, hv = layer.num_key_heads, layer.num_value_heads
    if world_size < 2 or hv % world_size or hv % hk:
        return False
    per_rank, group = hv // world_size, hv // hk
    return hk % world_size == 0 or group % per_rank == 0


def mamba_splits(layer: Mamba2, world_size: int) -> bool:
    return world_size > 1 and layer.num_heads % world_size == 0 and \
        layer.groups % world_size == 0 and layer.num_heads % layer.groups == 0


Ranges = list[tuple[int, int]]


def deltanet_ranges(layer: GatedDeltaNet, rank: int, world_size: int
                    ) -> tuple[Ranges, Ranges, tuple[int, int]]:
    """(the rank's rows of the input projection, its convolution channels, its value heads
    [v0, v1)): value heads [r Hv/N, (r+1) Hv/N) and the key heads they read."""
    hk, hv, dk, dv = layer.num_key_heads, layer.num_value_heads, layer.key_dim, layer.value_dim
    per_rank, group = hv // world_size, hv // hk
    v0, v1 = rank * per_rank, (rank + 1) * per_rank
    k0, k1 = v0 // group, -(-v1 // group)
    channels, values = layer.conv_channels, hv * dv
    conv = [(k0 * dk, k1 * dk), (hk * dk + k0 * dk, hk * dk + k1 * dk),
            (2 * hk * dk + v0 * dv, 2 * hk * dk + v1 * dv)]
    # q, k, v (the convolution's channels), then z, b and a of the rank's value heads.
    rows = conv + [(channels + v0 * dv, channels + v1 * dv),
                   (channels + values + v0, channels + values + v1),
                   (channels + values + hv + v0, channels + values + hv + v1)]
    return rows, conv, (v0, v1)


def split_deltanet(layer: GatedDeltaNet, rank: int, world_size: int, in_proj: Any
                   ) -> GatedDeltaNet:
    """Rank `rank`'s Gated DeltaNet (deltanet_splits must hold), whose input projection
    `in_proj` computes deltanet_ranges' rows."""
    _, conv, (v0, v1) = deltanet_ranges(layer, rank, world_size)
    per_rank = v1 - v0
    group = layer.num_value_heads // layer.num_key_heads
    return dataclasses.replace(
        layer, in_proj=in_proj,
        out_proj=GatheredInput(layer.out_proj, [per_rank * layer.value_dim] * world_size),
        conv_weight=np.ascontiguousarray(layer.conv_weight[:, _index(conv)]),
        decay_rate=layer.decay_rate[v0:v1].copy(), dt_bias=layer.dt_bias[v0:v1].copy(),
        num_key_heads=-(-v1 // group) - v0 // group, num_value_heads=per_rank)


def mamba_ranges(layer: Mamba2, rank: int, world_size: int
                 ) -> tuple[Ranges, Ranges, tuple[int, int], tuple[int, int]]:
    """(the rank's rows of the input projection, its convolution channels, its heads, its norm
    groups): heads [r H/N, (r+1) H/N) and groups [r G/N, (r+1) G/N)."""
    heads, dim, size = layer.num_heads, layer.head_dim, layer.state_size
    per_rank, groups = heads // world_size, layer.groups // world_size
    h0, h1, g0, g1 = rank * per_rank, (rank + 1) * per_rank, rank * groups, (rank + 1) * groups
    inner, states = layer.inner, layer.groups * size
    conv = [(h0 * dim, h1 * dim), (inner + g0 * size, inner + g1 * size),
            (inner + states + g0 * size, inner + states + g1 * size)]
    # gate, then x, B, C (the convolution's channels), then dt of the rank's heads.
    rows = [(h0 * dim, h1 * dim)] + [(inner + a, inner + b) for a, b in conv] + \
        [(inner + layer.conv_channels + h0, inner + layer.conv_channels + h1)]
    return rows, conv, (h0, h1), (g0, g1)


def split_mamba(layer: Mamba2, rank: int, world_size: int, in_proj: Any,
                in_bias: Any = None) -> Mamba2:
    """Rank `rank`'s Mamba-2 (mamba_splits must hold), whose input projection `in_proj` (and
    bias `in_bias`) computes mamba_ranges' rows."""
    _, conv, (h0, h1), (g0, g1) = mamba_ranges(layer, rank, world_size)
    dim, index = layer.head_dim, _index(conv)
    return dataclasses.replace(
        layer, in_proj=in_proj, in_bias=in_bias,
        out_proj=GatheredInput(layer.out_proj, [(h1 - h0) * dim] * world_size),
        conv_weight=np.ascontiguousarray(layer.conv_weight[:, index]),
        conv_bias=None if layer.conv_bias is None else
        np.ascontiguousarray(layer.conv_bias[index]),
        a=layer.a[h0:h1].copy(), dt_bias=layer.dt_bias[h0:h1].copy(),
        skip=layer.skip[h0:h1].copy(),
        norm_weight=np.ascontiguousarray(layer.norm_weight[h0 * dim:h1 * dim]),
        num_heads=h1 - h0, groups=g1 - g0)


def _index(ranges: Ranges) -> np.ndarray:
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


class Unpacked:
    """A stand-in backend under which a family's layer loader returns its weights as stored
    (matrices and vectors unpacked), to take the rank's rows from."""

    @staticmethod
    def matrix(weight: Any) -> Any:
        return weight

    @staticmethod
    def vector(values: Any) -> Any:
        return values


def split_recurrent_layers(model: Any, checkpoint: Any, backend: Any, stored_layer: Any) -> int:
    """Replace, in place, every recurrent layer of a DecoderModel on a GatheringBackend that
    can be split by heads with this rank's part: its input projection's rows of the rank's
    heads computed locally (whole dot products, nothing gathered), the rest as the module
    docstring says. The layer's weights are loaded again as stored by the family's
    `stored_layer` (models/split.py). Returns how many were split (the others stay whole)."""
    from exactdraft.models.tensors import TensorReader

    rank, world_size = backend.group.rank, backend.group.world_size
    reader = TensorReader(checkpoint.tensors, checkpoint.config.source)
    split = 0
    for index, layer in enumerate(model.layers):
        mixer = layer.mixer
        if type(mixer) is GatedDeltaNet and deltanet_splits(mixer, world_size):
            rows = deltanet_ranges(mixer, rank, world_size)[0]
        elif type(mixer) is Mamba2 and mamba_splits(mixer, world_size):
            rows = mamba_ranges(mixer, rank, world_size)[0]
        else:
            continue
        stored = stored_layer(Unpacked(), reader, checkpoint.config, index, mixer)
        backend.forget(mixer.in_proj)  # replaced by the rank's rows
        in_proj = backend.local_matrix(stack_rows([weight_rows(stored.in_proj, a, b)
                                                   for a, b in rows]))
        if type(mixer) is GatedDeltaNet:
            layer.mixer = split_deltanet(mixer, rank, world_size, in_proj)
        else:
            bias = None if stored.in_bias is None else backend.vector(np.concatenate(
                [np.asarray(stored.in_bias, np.float32)[a:b] for a, b in rows]))
            layer.mixer = split_mamba(mixer, rank, world_size, in_proj, bias)
        split += 1
    model.recurrent = [layer.mixer for layer in model.layers
                       if hasattr(layer.mixer, "empty_state")]
    return split
