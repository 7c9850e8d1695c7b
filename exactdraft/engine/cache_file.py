"""Prefix caches on disk: one safetensors file per model, so a restarted process starts warm.

Invariant: a block read from a file is used only if the file is whole and was written for this
very model: its format tag, weights digest, arithmetic contract, model settings (backend and
dtype, context, key block, vocabulary) and KV layout equal the loaded model's, a sha256 over
every tensor's bytes equals the one recorded, and each block's key is the sha256 chain of its
parent's key and its own tokens; with a key, the file's HMAC-SHA256 (over its header, which
holds that sha256) must also be the key's. A file that fails any of these (corrupt, truncated,
another model's, another machine's arithmetic, edited without the key) is ignored with a
RuntimeWarning naming the file and the reason, and nothing of it is used. A file is written to
a temporary name in the same folder and renamed into place, so no reader ever sees half a file.

What the checks rest on: the digests catch corruption and edits that leave the recorded sha256
alone; whoever can rewrite the file can recompute that sha256, so without a key the file is as
trusted as the folder it lives in (which could hold the weights too). The key (kept out of the
file, given to the server) makes an edit without it detectable.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
import warnings
from typing import Any

import numpy as np

from exactdraft.engine.prefix_cache import ROOT, Block, PrefixCache, block_key
from exactdraft.errors import ExactdraftError

FORMAT = "exactdraft-prefix-cache/1"


class CacheFileError(ExactdraftError, ValueError):
    """A prefix cache file cannot be used; the message names the file and the reason."""


def fingerprint(target: Any) -> dict[str, str]:
    """What a cache file must match: the weights as loaded, the arithmetic of their bits and
    the settings the KV cache's bits follow (backend and dtype, context, key block,
    vocabulary)."""
    from exactdraft.models.target import backend_label

    settings = {"backend": backend_label(target), "max_context": target.max_context,
                "key_block": target.key_block, "vocab_size": target.vocab_size}
    return {"weights_digest": target.weights_digest(), "arithmetic": str(target.arithmetic),
            "settings": json.dumps(settings, sort_keys=True)}


def check_location(path: str | os.PathLike[str]) -> None:
    """CacheFileError unless a cache file can be written at `path`: not a folder, in an
    existing folder where a file can be created (tried: a temporary file is made and
    removed), replacing a file that is not read-only."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CacheFileError(f"{path}: is a folder; name a file in it")
    if not os.path.isdir(folder):
        raise CacheFileError(f"{path}: its folder {folder} does not exist (or is not a folder)")
    try:
        handle, probe = tempfile.mkstemp(prefix=".prefix-cache-", suffix=".tmp", dir=folder)
    except OSError as error:
        raise CacheFileError(f"{path}: cannot write in {folder} ({error.strerror})") from None
    os.close(handle)
    os.remove(probe)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CacheFileError(f"{path}: the file is read-only")


def signature(metadata: dict[str, str], key: bytes) -> str:
    """HMAC-SHA256 under `key` of a file's header (every field but the signature, in order of
    name); the header holds the sha256 of the tensors, so this signs them too."""
    fields = {name: value for name, value in metadata.items() if name != "hmac"}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def save(cache: PrefixCache, path: str | os.PathLike[str], target: Any,
         key: bytes | None = None) -> int:
    """Write every cached block to `path` (replacing it whole), signed with `key` when one is
    given; returns the block count."""
    from safetensors.numpy import save_file

    blocks = cache.blocks()
    tensors: dict[str, np.ndarray] = {}
    for index, block in enumerate(blocks):
        tensors[f"{index}.keys"] = block.keys
        tensors[f"{index}.values"] = block.values
        tensors[f"{index}.tokens"] = np.asarray(block.tokens, dtype=np.int64)
    metadata = {"format": FORMAT, **fingerprint(target),
                "block_tokens": str(cache.block_tokens),
                "blocks": json.dumps([[b.key.hex(), b.parent.hex()] for b in blocks]),
                "sha256": _content_digest(tensors)}
    if key is not None:
        metadata["hmac"] = signature(metadata, key)
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".prefix-cache-", suffix=".tmp", dir=folder)
    os.close(handle)
    try:
        save_file(tensors, temporary, metadata=metadata)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return len(blocks)


def load(cache: PrefixCache, path: str | os.PathLike[str], target: Any,
         key: bytes | None = None) -> int:
    """Add the blocks of a cache file to `cache`; returns how many were added. A file that
    cannot be used (with `key`: one not signed with it) adds nothing and is reported with a
    RuntimeWarning."""
    try:
        blocks = read(path, target, cache.block_tokens, key)
    except CacheFileError as error:
        warnings.warn(f"ignoring the prefix cache file: {error}", RuntimeWarning, stacklevel=2)
        return 0
    return sum(cache.add(block) for block in blocks)


def read(path: str | os.PathLike[str], target: Any, block_tokens: int,
         key: bytes | None = None) -> list[Block]:
    """Every block of the file, checked as the module docstring says; CacheFileError if any
    check fails."""
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    path = os.fspath(path)
    try:
        with safe_open(path, framework="np") as handle:
            metadata = handle.metadata()
        tensors = load_file(path)
    except (OSError, ValueError, SafetensorError) as error:
        raise CacheFileError(f"{path}: not a readable safetensors file ({error})") from None
    if not isinstance(metadata, dict):
        raise CacheFileError(f"{path}: no prefix cache metadata")
    if key is not None and not hmac.compare_digest(str(metadata.get("hmac", "")),
                                                   signature(metadata, key)):
        raise CacheFileError(f"{path}: it is not signed with this server's key (an edit, or "
                             "another key)")
    expected = {"format": FORMAT, **fingerprint(target), "block_tokens": str(block_tokens)}
    for name, value in expected.items():
        if metadata.get(name) != value:
            raise CacheFileError(f"{path}: {name} is {metadata.get(name)!r}, this model needs "
                                 f"{value!r}")
    if metadata.get("sha256") != _content_digest(tensors):
        raise CacheFileError(f"{path}: its tensors do not match their recorded sha256")
    try:
        entries = json.loads(metadata.get("blocks", ""))
        keys = [(bytes.fromhex(key), bytes.fromhex(parent)) for key, parent in entries]
    except (ValueError, TypeError) as error:
        raise CacheFileError(f"{path}: the block list is damaged ({error})") from None
    # The layout (layers, kv heads, head dim) of this model's keys: an export of no positions.
    empty, _ = target.export_kv(target.new_state(), 0, 0)
    layout = (empty.shape[0], empty.shape[1], block_tokens, empty.shape[3])
    return [_block(path, tensors, index, key, parent, target, layout)
            for index, (key, parent) in enumerate(keys)]


def _block(path: str, tensors: dict[str, np.ndarray], index: int, key: bytes, parent: bytes,
           target: Any, layout: tuple[int, int, int, int]) -> Block:
    try:
        keys, values = tensors[f"{index}.keys"], tensors[f"{index}.values"]
        tokens = tensors[f"{index}.tokens"]
    except KeyError as error:
        raise CacheFileError(f"{path}: block {index} has no tensor {error}") from None
    for array in (keys, values):
        if array.dtype != np.float32 or array.shape != layout or \
                not np.isfinite(array).all():
            raise CacheFileError(f"{path}: block {index} holds {array.dtype} {array.shape}, "
                                 f"not this model's finite float32 {layout}")
    if tokens.dtype != np.int64 or tokens.shape != (layout[2],) or \
            tokens.min() < 0 or tokens.max() >= target.vocab_size:
        raise CacheFileError(f"{path}: block {index} has tokens that are not this model's")
    own = tuple(int(t) for t in tokens)
    if block_key(parent, own) != key or (parent != ROOT and len(parent) != len(ROOT)):
        raise CacheFileError(f"{path}: block {index}'s key is not the hash of its tokens")
    return Block(key, parent, own, np.ascontiguousarray(keys), np.ascontiguousarray(values),
                 from_file=True)


def _content_digest(tensors: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}\0".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()
