"""Drafted == serial end to end on the Triton kernels (the torch backend on device "cpu", under
Triton's interpreter): a tiny model drafting with prompt lookup writes the serial tokens and
logprobs bit for bit, through every kernel a model pass runs (matmul, rms_norm, the attention
chunk and merge kernels, and the rounding to bfloat16 or float16), with drafts kept and rolled
back. In the default job the attention runs with small chunks and tiles (chunk 16, tile 8, the
configuration the kernel tests use), so a short context crosses several of each; the slow job
runs the kernels' own configuration over a context longer than a tile, a sliding window and
biased projections too. The negative control: the same backend with products split over the
inner dimension in passes of several rows (a split-K chosen by the row count) writes other
logprobs. The interpreter's rowwise dot step stands in for tl.dot here (INVARIANCE.md); the
hardware's dot is checked on a GPU (benchmarks/gpu_check.py)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

import exactdraft as xd  # noqa: E402
import exactdraft.kernels.triton.attention as triton_attention  # noqa: E402
from exactdraft.backends.torch_cuda import TorchCudaBackend  # noqa: E402

REPEATED = 71  # a token the bias below favours: the answer repeats it, so drafts are kept
PROMPT = ([REPEATED] * 5 + [5, 17, 60, 3, 41, 12]) * 2 + [REPEATED] * 5
# (temperature, options): the bias makes the answer repeat the token often but not always, so
# drafts are kept and rejected in one run.
CASE = (0.0, {"logit_bias": {REPEATED: 2.0}})
SLOW_CASES = [CASE, (0.9, {"seed": 4, "logit_bias": {REPEATED: 3.0}, "top_k": 20})]
NEW_TOKENS = 10
ORIGINAL_CONFIG = triton_attention.attention_config


def small_chunks(group: int, head_dim: int, dtype: str, device_type: str):
    """The kernel's configuration with 16-key chunks of 8-key tiles."""
    config = ORIGINAL_CONFIG(group, head_dim, dtype, device_type)
    return dataclasses.replace(config, chunk=16, tile=8)


class RowCountSplitK(TorchCudaBackend):
    """A plausible wrong backend: passes of several rows (verify passes, prompt chunks) split
    each product over two halves of the inner dimension, as a GEMM that picks a split-K by the
    row count does, so a verify row gets other bits than the same row's decode step."""

    def linear(self, x, weight, bias=None):
        if x.shape[0] == 1:
            return super().linear(x, weight, bias)
        half = x.shape[1] // 2
        first = self._matmul.matmul(x[:, :half].contiguous(), weight[:, :half].contiguous(),
                                    dot=self.dot)
        second = self._matmul.matmul(x[:, half:].contiguous(), weight[:, half:].contiguous(),
                                     bias, dot=self.dot)
        return first + second


def generator(folder: str, backend) -> xd.Generator:
    from exactdraft.pretrained import build_target, load_checkpoint

    # guard=False: the comparison below is the check (the guard's own passes would take
    # minutes under the interpreter).
    return xd.Generator(build_target(load_checkpoint(folder), backend),
                        xd.PromptLookup(max_draft=4, min_match=1), adaptive_depth=False,
                        guard=False, progress=False)


def runs(model: xd.Generator, prompt: list[int], temperature: float, options: dict,
         drafts: bool, new_tokens: int = NEW_TOKENS):
    return model.generate(prompt, new_tokens, temperature=temperature, logprobs=2,
                          stop_tokens=[], drafts=drafts, **options)


def same(drafted, serial) -> bool:
    return drafted.tokens == serial.tokens and drafted.logprobs == serial.logprobs


@pytest.fixture(scope="module")
def small_chunk_runs(tiny_checkpoints):
    """The drafted and serial runs of tiny mistral (llama with a 24-key sliding window) in
    bfloat16, and the drafted run of the row-count dependent backend, with the attention in
    small chunks: the window's first key moves across tiles and chunks as the run goes on."""
    temperature, options = CASE
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_attention, "attention_config", small_chunks)
        exact = generator(tiny_checkpoints["mistral"], TorchCudaBackend(device="cpu",
                                                                        dtype="bfloat16"))
        wrong = generator(tiny_checkpoints["mistral"], RowCountSplitK(device="cpu",
                                                                      dtype="bfloat16"))
        return (runs(exact, PROMPT, temperature, options, drafts=True),
                runs(exact, PROMPT, temperature, options, drafts=False),
                runs(wrong, PROMPT, temperature, options, drafts=True))


def test_drafted_equals_serial_through_the_triton_kernels(small_chunk_runs):
    drafted, serial, _ = small_chunk_runs
    assert same(drafted, serial), (drafted.tokens, serial.tokens)
    assert drafted.stats.drafting and drafted.stats.drafter_faults.total == 0
    # Drafts kept, and drafts rejected (their keys rolled back and overwritten).
    assert 0 < drafted.stats.accepted < drafted.stats.drafted, drafted.stats
    assert len(PROMPT) + NEW_TOKENS > 24 + 8  # the window left whole tiles behind


def test_negative_control_a_product_split_by_row_count(small_chunk_runs):
    _, serial, wrong = small_chunk_runs
    assert wrong.stats.drafted > 0
    assert not same(wrong, serial)


@pytest.mark.slow
@pytest.mark.parametrize("variant, dtype", [("llama", "float32"), ("mistral", "bfloat16"),
                                            ("qwen2", "float16")])
def test_drafted_equals_serial_with_the_kernel_configuration(tiny_checkpoints, variant, dtype):
    """The kernels' own chunks and tiles, over a context longer than one 64-key tile (and,
    for mistral, a sliding window of 24 keys)."""
    model = generator(tiny_checkpoints[variant], TorchCudaBackend(device="cpu", dtype=dtype))
    prompt = (PROMPT * 5)[:60]
    accepted = 0
    for temperature, options in SLOW_CASES:
        drafted = runs(model, prompt, temperature, options, drafts=True, new_tokens=16)
        serial = runs(model, prompt, temperature, options, drafts=False, new_tokens=16)
        assert same(drafted, serial), (variant, dtype, temperature)
        accepted += drafted.stats.accepted
    assert accepted > 0
