"""The recurrent layers of the hybrid families (Gated DeltaNet, Mamba-2) split by head group
across tensor-parallel ranks: each rank runs the recurrence of its own heads and keeps only
their state; the ranks gather the heads' outputs (in head order) before the out projection.

Invariant: TP=N writes the bits TP=1 writes. The input projection is column-split and gathered
like every matrix (backend.py: whole dot products, a copy), and the rank keeps the channels of
its heads (SelectedColumns: a copy of those columns). Everything between the projections is
host arithmetic that is elementwise per channel or reduces within one head or one norm group
(recurrent.py: the causal convolution per channel, silu, the decays per head, l2 norms per
key head, the scans' tree_sums over the key or state dimension per head, the gated RMS norm
per value head or per Mamba-2 group), so a rank that owns whole heads (and, for Mamba-2, whole
norm groups) computes each of its elements with exactly TP=1's arithmetic. The model's own
layer code runs unchanged on a copy of the layer holding the rank's parameters. A rank holds
1/N of each split layer's convolution and recurrent state; rollback restores the rank's own
snapshots (state.py), and replays run on every rank (target.py), so every rank rolls back alike.

A layer is split when N divides its value heads (Gated DeltaNet; and each rank's value heads
read whole key heads, or lie within one key head's group) or its heads and norm groups
(Mamba-2, whose gated norm spans a group of heads). Otherwise every rank runs that layer's
whole recurrence from the gathered projection: the same bits, without the split.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from exactdraft.models.gated_deltanet import GatedDeltaNet
from exactdraft.models.mamba2 import Mamba2
from exactdraft.parallel.heads import GatheredInput


class SelectedColumns:
    """A column-split matrix whose gathered output this rank keeps only some columns of (its
    heads' channels, in order): a copy of whole columns."""

    def __init__(self, shard: Any, columns: np.ndarray) -> None:
        self.shard = shard
        self.columns = columns
        import torch

        self.index = torch.from_numpy(columns)
        self.shape = (int(columns.size), shard.shape[1])


def _span(start: int, end: int) -> np.ndarray:
    return np.arange(start, end, dtype=np.int64)


def deltanet_splits(layer: GatedDeltaNet, world_size: int) -> bool:
    hk, hv = layer.num_key_heads, layer.num_value_heads
    if world_size < 2 or hv % world_size or hv % hk:
        return False
    per_rank, group = hv // world_size, hv // hk
    return hk % world_size == 0 or group % per_rank == 0


def mamba_splits(layer: Mamba2, world_size: int) -> bool:
    return world_size > 1 and layer.num_heads % world_size == 0 and \
        layer.groups % world_size == 0 and layer.num_heads % layer.groups == 0


def split_deltanet(layer: GatedDeltaNet, rank: int, world_size: int) -> GatedDeltaNet:
    """Rank `rank`'s Gated DeltaNet: value heads [r Hv/N, (r+1) Hv/N) and the key heads they
    read (deltanet_splits must hold)."""
    hk, hv, dk, dv = layer.num_key_heads, layer.num_value_heads, layer.key_dim, layer.value_dim
    per_rank, group = hv // world_size, hv // hk
    v0, v1 = rank * per_rank, (rank + 1) * per_rank
    k0, k1 = v0 // group, -(-v1 // group)
    channels, values = layer.conv_channels, hv * dv
    conv = np.concatenate([_span(k0 * dk, k1 * dk), hk * dk + _span(k0 * dk, k1 * dk),
                           2 * hk * dk + _span(v0 * dv, v1 * dv)])
    # q, k, v (the convolution's channels), then z, b and a of the rank's value heads.
    proj = np.concatenate([conv, channels + _span(v0 * dv, v1 * dv),
                           channels + values + _span(v0, v1),
                           channels + values + hv + _span(v0, v1)])
    return dataclasses.replace(
        layer, in_proj=SelectedColumns(layer.in_proj, proj),
        out_proj=GatheredInput(layer.out_proj, [per_rank * dv] * world_size),
        conv_weight=np.ascontiguousarray(layer.conv_weight[:, conv]),
        decay_rate=layer.decay_rate[v0:v1].copy(), dt_bias=layer.dt_bias[v0:v1].copy(),
        num_key_heads=k1 - k0, num_value_heads=per_rank)


def split_mamba(layer: Mamba2, rank: int, world_size: int) -> Mamba2:
    """Rank `rank`'s Mamba-2: heads [r H/N, (r+1) H/N) and the norm groups [r G/N, (r+1) G/N)
    they make up (mamba_splits must hold)."""
    heads, dim, size = layer.num_heads, layer.head_dim, layer.state_size
    per_rank, groups = heads // world_size, layer.groups // world_size
    h0, h1, g0, g1 = rank * per_rank, (rank + 1) * per_rank, rank * groups, (rank + 1) * groups
    inner, states = layer.inner, layer.groups * size
    conv = np.concatenate([_span(h0 * dim, h1 * dim), inner + _span(g0 * size, g1 * size),
                           inner + states + _span(g0 * size, g1 * size)])
    # gate, then x, B, C (the convolution's channels), then dt of the rank's heads.
    proj = np.concatenate([_span(h0 * dim, h1 * dim), inner + conv,
                           inner + layer.conv_channels + _span(h0, h1)])
    return dataclasses.replace(
        layer, in_proj=SelectedColumns(layer.in_proj, proj),
        out_proj=GatheredInput(layer.out_proj, [per_rank * dim] * world_size),
        conv_weight=np.ascontiguousarray(layer.conv_weight[:, conv]),
        conv_bias=None if layer.conv_bias is None else
        np.ascontiguousarray(layer.conv_bias[conv]),
        a=layer.a[h0:h1].copy(), dt_bias=layer.dt_bias[h0:h1].copy(),
        skip=layer.skip[h0:h1].copy(),
        norm_weight=np.ascontiguousarray(layer.norm_weight[h0 * dim:h1 * dim]),
        num_heads=per_rank, groups=groups)


def split_recurrent_layers(model: Any, rank: int, world_size: int) -> int:
    """Replace, in place, every recurrent layer of a DecoderModel that can be split by heads
    with this rank's part; returns how many were split (the others stay whole)."""
    split = 0
    for layer in model.layers:
        mixer = layer.mixer
        if type(mixer) is GatedDeltaNet and deltanet_splits(mixer, world_size):
            layer.mixer = split_deltanet(mixer, rank, world_size)
        elif type(mixer) is Mamba2 and mamba_splits(mixer, world_size):
            layer.mixer = split_mamba(mixer, rank, world_size)
        else:
            continue
        split += 1
    model.recurrent = [layer.mixer for layer in model.layers
                       if hasattr(layer.mixer, "empty_state")]
    return split
