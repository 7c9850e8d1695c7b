"""Mixture-of-experts families (qwen3_moe, mixtral; the MoE MLPs of qwen3_next, qwen3_5_moe and
nemotron_h): logits against transformers, routing against transformers' routers, and a row's
bits independent of the rows that share its experts, with negative controls."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from exactdraft.guard import probe_tokens
from exactdraft.models.moe import RouterSettings, route, top_indices
from tests.hybrid_checkpoints import MOE_FAMILIES, fused_experts_copy


@functools.cache
def hf_logits(folder: str, tokens: tuple[int, ...]) -> np.ndarray:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([list(tokens)])).logits[0].numpy()


def relative_error(ours: np.ndarray, reference: np.ndarray) -> float:
    scale = float(np.abs(reference).max())
    assert scale > 1.0  # the fixture's logits spread over several units
    return float(np.abs(ours - reference).max()) / scale


@pytest.mark.parametrize("variant", MOE_FAMILIES)
def test_logits_match_transformers(variant, hybrid_checkpoints, hybrid_targets):
    target = hybrid_targets(variant)
    tokens = probe_tokens(60, target.vocab_size, salt=3)  # longer than mixtral's window
    ours = target.forward(target.new_state(), tokens, rows="all")
    assert relative_error(ours, hf_logits(hybrid_checkpoints[variant], tuple(tokens))) < 2e-5


@pytest.mark.parametrize("variant", MOE_FAMILIES)
def test_verify_window_and_chunked_prefill_are_bitwise(variant, hybrid_targets):
    target = hybrid_targets(variant)
    prefix = probe_tokens(30, target.vocab_size, salt=1)
    window = probe_tokens(9, target.vocab_size, salt=2)
    state = target.new_state()
    target.forward(state, prefix)
    singles = [target.forward(state, [token])[0].tobytes() for token in window]
    for width in range(1, 10):
        target.truncate(state, len(prefix))
        rows = target.forward(state, window[:width], rows="all")
        assert [row.tobytes() for row in rows] == singles[:width], (variant, width)
    tokens = prefix + window
    whole = target.forward(target.new_state(), tokens, rows="all")
    chunked, begin = target.new_state(), 0
    for size in (1, 6, 13, 19):
        rows = target.forward(chunked, tokens[begin:begin + size], rows="all")
        assert rows.tobytes() == whole[begin:begin + size].tobytes()
        begin += size


def sharing_passes(target) -> tuple[list[int], list[list[int]]]:
    """A sequence, and a pass that adds the rows of other sequences beside its last token."""
    mine = probe_tokens(12, target.vocab_size, salt=11)
    others = [probe_tokens(5 + i, target.vocab_size, salt=20 + i) for i in range(3)]
    return mine, others


def rows_alone_and_shared(target) -> tuple[bytes, bytes]:
    """The last row of a sequence run alone and run in one pass with three other sequences,
    whose rows route to the same experts as some of its own."""
    mine, others = sharing_passes(target)
    alone = target.forward(target.new_state(), mine, rows="all").tobytes()
    states = [target.new_state() for _ in range(4)]
    shared = target.forward_batch(states, [mine, *others], rows="all")[0].tobytes()
    return alone, shared


@pytest.mark.parametrize("variant", ["qwen3_moe", "qwen3_5_moe", "nemotron_h"])
def test_a_rows_bits_do_not_depend_on_who_shares_its_experts(variant, hybrid_targets):
    target = hybrid_targets(variant)
    block = next(layer.feed_forward for layer in target.layers
                 if type(layer.feed_forward).__name__ == "MoEBlock")
    mine, others = sharing_passes(target)
    # The premise: other rows of the pass do choose this sequence's experts.
    chosen = []
    for tokens in (mine, *others):
        x = target.backend.vector(target.embedding[tokens])
        logits = target.backend.to_host(target.backend.linear(x, block.entry))
        logits = logits[:, :block.settings.num_experts]
        chosen.append(set(route(block.settings, logits, block.correction_bias)[0].ravel()))
    assert chosen[0] & set().union(*chosen[1:])
    alone, shared = rows_alone_and_shared(target)
    assert alone == shared


def test_negative_control_expert_sharing_on_a_row_count_dependent_backend(hybrid_checkpoints):
    """With matmuls whose bits follow the row count an expert that runs on more rows gives a
    row other bits, and the comparison above sees it. torch's plain matmul is such a backend
    on some CPUs only (MKL's paths for these tiny shapes are a fact about the CPU); where its
    bits came out the same, the control runs on a backend whose products change with the row
    count on every machine."""
    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.inexact import InexactTorchBackend

    checkpoint = load_checkpoint(hybrid_checkpoints["qwen3_moe"])
    alone, shared = rows_alone_and_shared(build_target(checkpoint, InexactTorchBackend()))
    if alone == shared:
        coarse = build_target(checkpoint, InexactTorchBackend(coarse=True))
        alone, shared = rows_alone_and_shared(coarse)
    assert alone != shared


def test_fused_experts_load_to_the_same_bits(hybrid_checkpoints, hybrid_targets, tmp_path):
    from exactdraft.pretrained import build_target, load_checkpoint

    fused = fused_experts_copy(hybrid_checkpoints["qwen3_5_moe"], str(tmp_path / "fused"), 4)
    target = build_target(load_checkpoint(fused), "torch")
    tokens = probe_tokens(20, target.vocab_size, salt=4)
    ours = target.forward(target.new_state(), tokens, rows="all")
    reference = hybrid_targets("qwen3_5_moe")
    assert ours.tobytes() == reference.forward(reference.new_state(), tokens,
                                               rows="all").tobytes()
    assert target.weights_digest() != reference.weights_digest()  # other tensors were read


def test_ties_go_to_the_lower_expert_and_rows_route_alone():
    assert top_indices(np.array([[1.0, 3.0, 3.0, 2.0]]), 2).tolist() == [[1, 2]]
    settings = RouterSettings(num_experts=4, top_k=2)
    logits = np.array([[0.5, 2.0, 2.0, -1.0], [3.0, 0.0, 1.0, 2.0]], dtype=np.float32)
    experts, weights = route(settings, logits)
    assert experts.tolist() == [[1, 2], [0, 3]]
    assert weights.dtype == np.float32 and weights[0, 0] == weights[0, 1]
    alone = route(settings, logits[1:])
    assert alone[0].tolist() == experts[1:].tolist()
    assert alone[1].tobytes() == weights[1:].tobytes()


@pytest.mark.parametrize("scoring", ["qwen3_moe", "qwen3_5_moe", "nemotron_h"])
def test_routing_matches_transformers_routers(scoring):
    import torch
    from transformers.models.nemotron_h.configuration_nemotron_h import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHTopkRouter
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeTopKRouter
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    rng = np.random.default_rng(5)
    logits = rng.standard_normal((200, 8)).astype(np.float32) * 2
    bias = np.linspace(-0.3, 0.3, 8)
    if scoring == "nemotron_h":
        router = NemotronHTopkRouter(NemotronHConfig(
            hidden_size=8, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
            routed_scaling_factor=2.5, norm_topk_prob=True))
        router.e_score_correction_bias.copy_(torch.from_numpy(bias).float())
        settings = RouterSettings(8, 3, scoring="sigmoid", scale=2.5, norm_epsilon=1e-20,
                                  groups=4, top_groups=2)
    elif scoring == "qwen3_moe":
        router = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=8, num_experts=8,
                                                   num_experts_per_tok=3, norm_topk_prob=False))
        settings, bias = RouterSettings(8, 3, normalize=False), None
    else:
        router = Qwen3_5MoeTopKRouter(Qwen3_5MoeTextConfig(hidden_size=8, num_experts=8,
                                                           num_experts_per_tok=3))
        settings, bias = RouterSettings(8, 3), None
    with torch.no_grad():
        router.weight.copy_(torch.eye(8))
        _, their_weights, their_experts = router(torch.from_numpy(logits))
    experts, weights = route(settings, logits, bias)
    order = np.argsort(their_experts.numpy(), axis=1)
    theirs = np.take_along_axis(their_experts.numpy(), order, 1)
    mine = np.argsort(experts, axis=1)
    assert np.array_equal(np.take_along_axis(experts, mine, 1), theirs)
    np.testing.assert_allclose(np.take_along_axis(weights, mine, 1),
                               np.take_along_axis(their_weights.numpy(), order, 1), rtol=2e-6)
