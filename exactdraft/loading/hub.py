"""Hub ids resolved to local folders through huggingface_hub, with errors that name the id.

Invariant: only configuration, tokenizer and safetensors files are fetched or read from the
hub; weights in other formats (*.bin, *.pt) are never downloaded, so they can never be loaded.
"""

from __future__ import annotations

from exactdraft.errors import CheckpointError

ALLOWED_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja"]


def looks_like_hub_id(value: str) -> bool:
    parts = value.split("/")
    return len(parts) == 2 and all(parts) and not value.startswith((".", "~"))


def snapshot_folder(repo_id: str, revision: str | None = None,
                    cache_dir: str | None = None) -> str:
    """The local folder holding `repo_id` (downloaded unless offline, where only the cache
    is used)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError as error:  # pragma: no cover - a base dependency
        raise CheckpointError(f"loading hub id {repo_id!r} needs huggingface_hub") from error
    try:
        return snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                 allow_patterns=ALLOWED_FILES)
    except HFValidationError as error:
        raise CheckpointError(f"{repo_id!r} is not a valid hub id or local path") from error
    except Exception as error:  # the hub client raises many kinds; all mean "not available"
        from huggingface_hub import constants

        where = "the local Hugging Face cache (offline mode)" if constants.HF_HUB_OFFLINE \
            else "the local cache or the hub"
        raise CheckpointError(
            f"model {repo_id!r} (revision {revision or 'main'}) is not available from {where}: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from error
