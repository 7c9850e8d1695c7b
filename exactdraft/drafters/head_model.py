"""The draft head's weights and arithmetic (numpy, float32), and its files.

Invariant: a head is stored as a safetensors file of its own weights (never pickle) and a JSON
config that names the target it was trained for by that target's weights digest; it is read
back only for a target with that very digest, and a stored head gives the same arithmetic, so
the same drafts, as the head that was saved. The head's arithmetic affects drafts only: the
verifier keeps a draft only when it equals the target's own sample. Its draft vocabulary
(`draft_ids`, the target ids it can propose) is stored with it as integers and read back bit
for bit; a file whose vocabulary is not integer, holds an id outside the target's vocabulary
or one id twice, or is not ascending, is refused with the file and the id named.

The computation (EAGLE): head row p reads the embedding of token x_p and a feature of position
p - 1 (the target's final hidden state there, or the head's own output row when it drafts
ahead), x = fc([embedding, feature]), then one pre-norm decoder block (attention over the
head's own KV cache with rotary positions, a gated SiLU MLP) and a final RMSNorm. The output
row stands for the target's feature of position p; times the target's output matrix over the
draft vocabulary it gives the head's logits for x_{p + 1}. exactdraft/training/torch_head.py
is the same computation in torch, for training.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from exactdraft.errors import CheckpointError
from exactdraft.models.target import capabilities_of

FORMAT = "exactdraft-draft-head"
VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "head.safetensors"
STORE_DTYPES = ("float16", "float32")


@dataclass(frozen=True)
class HeadConfig:
    """The head's shapes and the target it belongs to (`target_digest`: the target's
    weights_digest(), `target_vocab_size` its vocabulary)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    target_digest: str
    target_vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    target_name: str = ""
    training: dict[str, Any] = field(default_factory=dict)  # how it was made, for the record

    def shapes(self) -> dict[str, tuple[int, ...]]:
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, \
            self.num_kv_heads * self.head_dim
        i = self.intermediate_size
        return {"fc.weight": (h, 2 * h), "attention_norm.weight": (h,), "q.weight": (q, h),
                "k.weight": (kv, h), "v.weight": (kv, h), "o.weight": (h, q),
                "mlp_norm.weight": (h,), "gate.weight": (i, h), "up.weight": (i, h),
                "down.weight": (h, i), "final_norm.weight": (h,),
                "draft_ids": (self.draft_vocab_size,)}

    @classmethod
    def for_target(cls, target: Any, draft_vocab_size: int,
                   intermediate_size: int | None = None, **extra: Any) -> HeadConfig:
        """A head shaped like one layer of `target` (a DecoderModel's config; a HybridModel's
        head_shape: an attention layer with a dense MLP at its width)."""
        c = layer_of(target)
        name = os.path.basename(str(c.source))
        if name == "config.json":  # a checkpoint folder: its name
            name = os.path.basename(os.path.dirname(os.path.abspath(str(c.source))))
        return cls(hidden_size=c.hidden_size, num_heads=c.num_heads,
                   num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                   intermediate_size=intermediate_size or c.intermediate_size,
                   draft_vocab_size=draft_vocab_size, target_digest=target.weights_digest(),
                   target_vocab_size=target.vocab_size, rms_norm_eps=float(c.rms_norm_eps),
                   rope_theta=float(c.rope_theta), target_name=name, **extra)


def layer_of(target: Any) -> Any:
    """What a head copies from its target: hidden_size, heads, head_dim, MLP size, eps, rope."""
    return target.head_shape if capabilities_of(target).describes_head_layer else target.config


@dataclass
class HeadWeights:
    """A head's config and float32 weights (draft_ids: int64 target token ids, ascending)."""

    config: HeadConfig
    tensors: dict[str, np.ndarray]

    def __post_init__(self) -> None:
        check_tensors(self.config, self.tensors, "<head>")

    def save(self, folder: str | os.PathLike[str], dtype: str = "float16") -> None:
        """config.json and head.safetensors in `folder` (weights stored as `dtype`)."""
        from safetensors.numpy import save_file

        if dtype not in STORE_DTYPES:
            raise CheckpointError(f"a head is stored as one of {STORE_DTYPES}, not {dtype!r}")
        os.makedirs(folder, exist_ok=True)
        stored = {name: (value.astype(np.int32) if name == "draft_ids" else
                         value.astype(dtype)) for name, value in sorted(self.tensors.items())}
        # One metadata key: safetensors writes a map's keys in no fixed order.
        save_file(stored, os.path.join(folder, WEIGHTS_FILE), metadata={"format": FORMAT})
        document = {"format": FORMAT, "version": VERSION, **asdict(self.config)}
        with open(os.path.join(folder, CONFIG_FILE), "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1, sort_keys=True)
            handle.write("\n")

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> HeadWeights:
        """Read a head folder; a CheckpointError names the file and what is wrong."""
        from safetensors.numpy import load_file

        config = read_config(folder)
        weights_path = os.path.join(os.fspath(folder), WEIGHTS_FILE)
        if not os.path.isfile(weights_path):
            raise CheckpointError(f"{weights_path}: missing (a draft head folder holds "
                                  f"{CONFIG_FILE} and {WEIGHTS_FILE})")
        try:
            stored = load_file(weights_path)
        except Exception as error:  # safetensors raises its own error types
            raise CheckpointError(f"{weights_path}: not a readable safetensors file "
                                  f"({error})") from None
        check_stored_dtypes(stored, weights_path)
        tensors = {name: (value.astype(np.int64) if name == "draft_ids" else
                          value.astype(np.float32)) for name, value in stored.items()}
        check_tensors(config, tensors, weights_path)
        return cls(config, tensors)


def read_config(folder: str | os.PathLike[str]) -> HeadConfig:
    """The HeadConfig of a head folder's config.json (CheckpointError naming what is wrong)."""
    path = os.path.join(os.fspath(folder), CONFIG_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing (a draft head folder holds {CONFIG_FILE} and "
                              f"{WEIGHTS_FILE})")
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a draft head config (format must be {FORMAT!r})")
    if document.get("version") != VERSION:
        raise CheckpointError(f"{path}: version {document.get('version')!r}, this exactdraft "
                              f"reads version {VERSION}")
    try:
        return HeadConfig(**{k: v for k, v in document.items() if k not in ("format",
                                                                            "version")})
    except TypeError as error:
        raise CheckpointError(f"{path}: {error}") from None


def check_tensors(config: HeadConfig, tensors: dict[str, np.ndarray], where: str) -> None:
    expected = config.shapes()
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{where}: tensor {name!r} is missing")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape "
                                  f"{tuple(tensors[name].shape)}, the config calls for {shape}")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise CheckpointError(f"{where}: unexpected tensors {extra}")
    check_draft_ids(tensors["draft_ids"], config.target_vocab_size, where)
    if config.num_heads % config.num_kv_heads:
        raise CheckpointError(f"{where}: num_heads {config.num_heads} is not a multiple of "
                              f"num_kv_heads {config.num_kv_heads}")


def check_stored_dtypes(stored: dict[str, np.ndarray], where: str) -> None:
    """draft_ids stored as integers (int32 as save writes them, or int64), the weights as one
    of STORE_DTYPES: a float vocabulary or an integer weight is refused, not converted."""
    for name, value in sorted(stored.items()):
        allowed = ("int32", "int64") if name == "draft_ids" else STORE_DTYPES
        if value.dtype.name not in allowed:
            raise CheckpointError(f"{where}: tensor {name!r} is stored as {value.dtype.name}, "
                                  f"a head stores it as one of {allowed}")


def check_draft_ids(ids: np.ndarray, vocab_size: int, where: str) -> None:
    """The draft vocabulary: int64 target ids, each inside [0, vocab_size), strictly ascending
    (so distinct); the message names the first id at fault."""
    if ids.dtype != np.int64:
        raise CheckpointError(f"{where}: draft_ids has dtype {ids.dtype.name}, not int64")
    if ids.size == 0:
        raise CheckpointError(f"{where}: draft_ids is empty (a head proposes among its ids)")
    outside = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if outside.size:
        i = int(outside[0])
        raise CheckpointError(f"{where}: draft_ids[{i}] = {int(ids[i])} is outside the target's "
                              f"vocabulary [0, {vocab_size})")
    values, counts = np.unique(ids, return_counts=True)
    if np.any(counts > 1):
        raise CheckpointError(f"{where}: draft_ids holds id {int(values[counts > 1][0])} "
                              f"{int(counts[counts > 1][0])} times")
    unordered = np.flatnonzero(np.diff(ids) < 0)
    if unordered.size:
        i = int(unordered[0])
        raise CheckpointError(f"{where}: draft_ids must be ascending, but draft_ids[{i}] = "
                              f"{int(ids[i])} comes before draft_ids[{i + 1}] = "
                              f"{int(ids[i + 1])}")


# -- arithmetic --------------------------------------------------------------------------------

def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def rope_angles(positions: np.ndarray, head_dim: int, theta: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n, head_dim / 2] (float32, computed in float64) of rotate-half rope."""
    inverse = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inverse[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [n, heads, d] rotated (rotate-half layout) by per-row cos/sin [n, d / 2]."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([first * c - second * s, second * c + first * s], axis=-1)


class HeadCache:
    """The head's keys and values [kv heads, capacity, head dim]; rows [0, length) are used."""

    def __init__(self, config: HeadConfig, capacity: int = 256) -> None:
        shape = (config.num_kv_heads, capacity, config.head_dim)
        self.keys = np.zeros(shape, dtype=np.float32)
        self.values = np.zeros(shape, dtype=np.float32)
        self.length = 0

    def append(self, keys: np.ndarray, values: np.ndarray) -> None:
        """keys, values [kv heads, n, head dim]."""
        end = self.length + keys.shape[1]
        if end > self.keys.shape[1]:
            capacity = max(end, 2 * self.keys.shape[1])
            for name in ("keys", "values"):
                old = getattr(self, name)
                grown = np.zeros((old.shape[0], capacity, old.shape[2]), dtype=np.float32)
                grown[:, :self.length] = old[:, :self.length]
                setattr(self, name, grown)
        self.keys[:, self.length:end] = keys
        self.values[:, self.length:end] = values
        self.length = end

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


Linear = Callable[[str, np.ndarray], np.ndarray]  # (matrix name, x [n, K]) -> x @ matrix.T


def matrices(weights: HeadWeights) -> dict[str, np.ndarray]:
    """The head's matrices as head_rows multiplies them: q, k, v stacked as "qkv", gate and
    up as "gate_up" (stacking only concatenates output rows)."""
    t = weights.tensors
    return {"fc": t["fc.weight"], "o": t["o.weight"], "down": t["down.weight"],
            "qkv": np.concatenate([t["q.weight"], t["k.weight"], t["v.weight"]]),
            "gate_up": np.concatenate([t["gate.weight"], t["up.weight"]])}


def numpy_linear(weights: HeadWeights) -> Linear:
    """Plain numpy products, the reference arithmetic (tests, and hosts without a backend)."""
    stacked = matrices(weights)
    return lambda name, x: x @ stacked[name].T


def head_rows(weights: HeadWeights, cache: HeadCache, embeddings: np.ndarray,
              features: np.ndarray, positions: np.ndarray, linear: Linear | None = None
              ) -> np.ndarray:
    """The head's output rows [n, hidden] for n new rows appended to `cache`: row i reads
    embeddings[i] and features[i], sits at absolute position positions[i] and attends to the
    cache's earlier rows and to the new rows up to itself. `linear` does the matrix products
    (default: numpy_linear); everything else is numpy."""
    c, t = weights.config, weights.tensors
    linear = linear or numpy_linear(weights)
    n = embeddings.shape[0]
    x = linear("fc", np.concatenate([embeddings, features], axis=1).astype(np.float32))
    normed = rms_norm(x, t["attention_norm.weight"], c.rms_norm_eps)
    cos, sin = rope_angles(positions, c.head_dim, c.rope_theta)
    q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    qkv = linear("qkv", normed)
    q = rope(qkv[:, :q_size].reshape(n, c.num_heads, c.head_dim), cos, sin)
    k = rope(qkv[:, q_size:q_size + kv_size].reshape(n, c.num_kv_heads, c.head_dim), cos, sin)
    v = qkv[:, q_size + kv_size:].reshape(n, c.num_kv_heads, c.head_dim)
    before = cache.length
    cache.append(k.transpose(1, 0, 2), v.transpose(1, 0, 2))
    # Query head h reads key-value head h // group: q as [n, kv heads, group, d].
    grouped = q.reshape(n, c.num_kv_heads, c.num_heads // c.num_kv_heads, c.head_dim)
    keys, values = cache.keys[:, :cache.length], cache.values[:, :cache.length]
    scores = np.einsum("nkgd,ktd->kgnt", grouped, keys) * np.float32(c.head_dim ** -0.5)
    visible = np.arange(cache.length)[None, :] <= (before + np.arange(n))[:, None]
    scores = np.where(visible, scores, np.float32(-np.inf))
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores /= scores.sum(axis=-1, keepdims=True)
    attended = np.einsum("kgnt,ktd->nkgd", scores, values).reshape(n, c.num_heads * c.head_dim)
    h = x + linear("o", np.ascontiguousarray(attended))
    normed = rms_norm(h, t["mlp_norm.weight"], c.rms_norm_eps)
    gate_up = linear("gate_up", normed)
    gate, up = gate_up[:, :c.intermediate_size], gate_up[:, c.intermediate_size:]
    silu = gate * (np.float32(0.5) * (1 + np.tanh(np.float32(0.5) * gate)))  # no overflow
    h = h + linear("down", np.ascontiguousarray(silu * up))
    return rms_norm(h, t["final_norm.weight"], c.rms_norm_eps).astype(np.float32)
