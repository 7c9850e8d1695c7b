"""The draft head in torch, for training: the arithmetic of exactdraft/drafters/head_model.py
over padded batches, with drafting-ahead passes unrolled.

Invariant: pass 1 is the head's catch-up computation (row p reads token p and the target's
feature of p - 1, attending causally to rows <= p), and pass j >= 2 is what the head computes
when it drafts j - 1 tokens ahead of its last committed row: row p reads token p and the head's
own pass j - 1 output of position p - 1, and attends to pass-1 rows of positions
<= p - j + 1 and to the row of pass i at position p - j + i for i = 2..j (the rows its KV cache
holds at that moment in DraftHead.propose). So the losses train exactly the computations that
draft; `to_weights` gives the numpy head the same parameters (tests hold the two equal).
torch is imported when a TorchHead is built, not before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.drafters.head_model import HeadConfig, HeadWeights

NAMES = ("fc", "q", "k", "v", "o", "gate", "up", "down")
NORMS = ("attention_norm", "mlp_norm", "final_norm")
_MASKED = -1e30


def build(config: HeadConfig, final_norm: np.ndarray | None = None) -> Any:
    """A TorchHead with torch's default initialisation (seed torch first) but for the two
    matrices that end a residual branch (o, down), which start at zero, so the block starts as
    the identity; `final_norm` initialises the final norm's weight."""
    import torch

    class TorchHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = config
            h, q, kv = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
            shapes = {"fc": (2 * h, h), "q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h),
                      "gate": (h, c.intermediate_size), "up": (h, c.intermediate_size),
                      "down": (c.intermediate_size, h)}
            for name in NAMES:
                setattr(self, name, torch.nn.Linear(*shapes[name], bias=False))
            for name in NORMS:
                setattr(self, name, torch.nn.Parameter(torch.ones(h)))
            with torch.no_grad():
                self.o.weight.zero_()
                self.down.weight.zero_()
                if final_norm is not None:
                    self.final_norm.copy_(torch.from_numpy(np.asarray(final_norm, np.float32)))
            inverse = c.rope_theta ** (-np.arange(0, c.head_dim, 2, dtype=np.float64)
                                       / c.head_dim)
            self.inverse_frequencies = inverse

        def forward(self, embeddings: Any, features: Any, depth: int) -> list[Any]:
            return unrolled(self, config, embeddings, features, depth)

    return TorchHead()


def norm(x: Any, weight: Any, eps: float) -> Any:
    import torch

    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def rope_tables(module: Any, length: int) -> tuple[Any, Any]:
    """cos, sin [length, d / 2] for positions 1..length (row r is position r + 1)."""
    import torch

    angles = np.arange(1, length + 1, dtype=np.float64)[:, None] * \
        module.inverse_frequencies[None, :]
    return (torch.from_numpy(np.cos(angles).astype(np.float32)),
            torch.from_numpy(np.sin(angles).astype(np.float32)))


def rotate(x: Any, cos: Any, sin: Any) -> Any:
    """x [B, heads, T, d] by cos/sin [T, d / 2] (rotate-half layout)."""
    import torch

    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def shift(x: Any, steps: int) -> Any:
    """x [..., T, d] moved `steps` rows later along T (zeros in front)."""
    import torch

    if steps == 0:
        return x
    pad = torch.zeros_like(x[..., :steps, :])
    return torch.cat([pad, x[..., :-steps, :]], dim=-2)


def unrolled(m: Any, c: HeadConfig, embeddings: Any, features: Any, depth: int) -> list[Any]:
    """Outputs [B, T, hidden] of passes 1..depth. embeddings[:, r] is the embedding of token
    r + 1 and features[:, r] the target's feature of position r, so row r is position r + 1.
    Rows r < j - 1 of pass j have no meaning (nothing drafts that far from position 1)."""
    import torch

    batch, length, _ = embeddings.shape
    cos, sin = rope_tables(m, length)
    group = c.num_heads // c.num_kv_heads
    scale = c.head_dim ** -0.5
    rows = torch.arange(length)
    keys, values, outputs = [], [], []
    previous = features
    for j in range(1, depth + 1):
        x = m.fc(torch.cat([embeddings, previous], dim=-1))
        normed = norm(x, m.attention_norm, c.rms_norm_eps)

        def heads(projection: Any, count: int, normed: Any = normed) -> Any:
            return projection(normed).view(batch, length, count, c.head_dim).transpose(1, 2)

        q = rotate(heads(m.q, c.num_heads), cos, sin)
        k = rotate(heads(m.k, c.num_kv_heads), cos, sin).repeat_interleave(group, dim=1)
        v = heads(m.v, c.num_kv_heads).repeat_interleave(group, dim=1)
        keys.append(k)
        values.append(v)
        # Pass-1 rows of positions <= p - j + 1, then pass i's row at p - j + i (i = 2..j).
        scores = [(q @ keys[0].transpose(-1, -2)) * scale]
        visible = rows[None, :] <= rows[:, None] - (j - 1)
        scores[0] = scores[0].masked_fill(~visible, _MASKED)
        for i in range(2, j + 1):
            scores.append(((q * shift(keys[i - 1], j - i)).sum(-1) * scale)[..., None])
        weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
        attended = weights[..., :length] @ values[0]
        for i in range(2, j + 1):
            attended = attended + weights[..., length + i - 2:length + i - 1] * \
                shift(values[i - 1], j - i)
        attended = attended.transpose(1, 2).reshape(batch, length, c.num_heads * c.head_dim)
        h = x + m.o(attended)
        normed = norm(h, m.mlp_norm, c.rms_norm_eps)
        h = h + m.down(torch.nn.functional.silu(m.gate(normed)) * m.up(normed))
        out = norm(h, m.final_norm, c.rms_norm_eps)
        outputs.append(out)
        previous = shift(out, 1)
    return outputs


def to_weights(module: Any, config: HeadConfig, draft_ids: np.ndarray) -> HeadWeights:
    """The numpy head with the module's parameters (float32)."""
    tensors = {f"{name}.weight": getattr(module, name).weight.detach().numpy().copy()
               for name in NAMES}
    tensors.update({f"{name}.weight": getattr(module, name).detach().numpy().copy()
                    for name in NORMS})
    tensors["draft_ids"] = np.asarray(draft_ids, dtype=np.int64)
    return HeadWeights(config, tensors)


def parameter_arrays(module: Any) -> dict[str, np.ndarray]:
    """Every parameter as a float32 array, by name (for checkpoints)."""
    return {name: value.detach().numpy().copy() for name, value in module.named_parameters()}


def load_parameters(module: Any, arrays: dict[str, np.ndarray]) -> None:
    import torch

    with torch.no_grad():
        for name, value in module.named_parameters():
            value.copy_(torch.from_numpy(np.ascontiguousarray(arrays[name])))
