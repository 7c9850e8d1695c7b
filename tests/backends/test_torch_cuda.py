"""The torch backend on device "cuda" through the Triton kernels, exercised on CPU tensors under
Triton's interpreter: a tiny llama runs end to end, a W-row forward equals W one-row steps bit
for bit, and the library still imports and runs on CPU when triton is missing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

# Triton reads this once, when it is first imported; CPU tensors need the interpreter.
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch", reason="the torch backends need torch")

from exactdraft.backends.torch_backend import TorchBackend  # noqa: E402
from exactdraft.errors import BackendError  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs the triton package")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_backend(dtype: str):
    from exactdraft.backends.torch_cuda import TorchCudaBackend

    return TorchCudaBackend(device="cpu", dtype=dtype)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """variant -> folder of a tiny random checkpoint, built on first use."""
    pytest.importorskip("transformers")
    from tests.conftest import build_tiny_checkpoint

    built: dict[str, str] = {}

    def folder(variant: str) -> str:
        if variant not in built:
            built[variant] = build_tiny_checkpoint(str(tmp_path_factory.mktemp(variant)),
                                                   variant)
        return built[variant]

    return folder


def load(folder: str, backend):
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(folder), backend)


def bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


PROMPT = [5, 17, 60, 3, 3, 41, 12, 99, 7]


@needs_triton
@pytest.mark.parametrize("variant, dtype, prompt_length", [
    ("llama", "float32", 3),
    ("llama", "bfloat16", 3),
    ("mistral", "bfloat16", 26),  # sliding window of 24 keys: the verify rows slide past it
    pytest.param("qwen2", "float16", 3, marks=pytest.mark.slow),  # q/k/v biases
    pytest.param("qwen3", "bfloat16", 3, marks=pytest.mark.slow),  # q/k norms, head_dim 32
])
def test_a_verify_pass_equals_single_steps_bitwise(checkpoints, variant, dtype, prompt_length):
    model = load(checkpoints(variant), cpu_backend(dtype))
    prompt = (PROMPT * 3)[:prompt_length]
    verify = [8, 100, 21, 64]
    state = model.new_state()
    model.forward(state, prompt)
    window = model.forward(state, verify, rows="all")
    model.truncate(state, prompt_length)
    steps = np.concatenate([model.forward(state, [token], rows="all") for token in verify])
    assert np.array_equal(bits(window), bits(steps))


@needs_triton
def test_chunked_prefill_equals_one_pass(checkpoints):
    model = load(checkpoints("llama"), cpu_backend("bfloat16"))
    whole_state, piece_state = model.new_state(), model.new_state()
    whole = model.forward(whole_state, PROMPT)
    model.forward(piece_state, PROMPT[:2])
    model.forward(piece_state, PROMPT[2:8])
    pieces = model.forward(piece_state, PROMPT[8:])
    assert np.array_equal(bits(whole), bits(pieces))
    for layer in range(2):
        for buffers in ("keys", "values"):
            a = getattr(whole_state.cache, buffers)[layer][:, :len(PROMPT)]
            b = getattr(piece_state.cache, buffers)[layer][:, :len(PROMPT)]
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@needs_triton
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-5), ("bfloat16", 0.03)])
def test_matches_the_torch_cpu_backend(checkpoints, dtype, tolerance):
    model = load(checkpoints("llama"), cpu_backend(dtype))
    triton_logits = model.forward(model.new_state(), PROMPT, rows="all")
    reference_model = load(checkpoints("llama"), TorchBackend(dtype=dtype))
    cpu_logits = reference_model.forward(reference_model.new_state(), PROMPT, rows="all")
    assert triton_logits.shape == cpu_logits.shape == (len(PROMPT), 128)
    assert np.abs(triton_logits - cpu_logits).max() <= tolerance * np.abs(cpu_logits).max()


@needs_triton
def test_bad_configuration_is_reported():
    from exactdraft.backends.torch_cuda import TorchCudaBackend

    with pytest.raises(BackendError, match="float64"):
        TorchCudaBackend(device="cpu", dtype="float64")
    with pytest.raises(BackendError, match="dot mode"):
        TorchCudaBackend(device="cpu", dot="fast")
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="no CUDA device"):
            TorchCudaBackend(device="cuda")


def run_python(code: str, **env_changes: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, HF_HUB_OFFLINE="1")
    env.pop("TRITON_INTERPRET", None)
    env.update({k: v for k, v in env_changes.items() if v is not None})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_library_and_cpu_backend_work_without_triton():
    code = """
import sys
sys.modules["triton"] = None  # every `import triton` now raises ImportError
import numpy as np
import exactdraft
from exactdraft.backends.registry import get_backend
from exactdraft.errors import BackendError
backend = get_backend("torch", device="cpu", dtype="float32")
weight = backend.matrix(np.eye(4, dtype=np.float32))
x = backend.vector(np.arange(8, dtype=np.float32)).reshape(2, 4)
assert np.array_equal(backend.to_host(backend.linear(x, weight)), backend.to_host(x))
from exactdraft.backends.torch_cuda import TorchCudaBackend
try:
    TorchCudaBackend(device="cpu")
except BackendError as error:
    assert "triton" in str(error), error
    print("ok")
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@needs_triton
def test_cpu_device_without_the_interpreter_is_reported():
    code = """
from exactdraft.errors import BackendError
from exactdraft.backends.torch_cuda import TorchCudaBackend
try:
    TorchCudaBackend(device="cpu")
except BackendError as error:
    assert "TRITON_INTERPRET=1" in str(error), error
    print("ok")
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
