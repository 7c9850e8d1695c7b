"""GLM-4.5 (glm4_moe) on a tiny random checkpoint built with transformers (5 query heads over
one KV head, a rope on half of each head, q/k norms, q/k/v biases, a dense first layer, grouped
sigmoid routing with a correction bias and a shared expert): logits against transformers, W-row
passes against single steps and chunked against one-pass prefill (bits), drafted == serial at
T=0.8, with a negative control whose attention is plain softmax(q K^T) V."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.guard import check_row_invariance, probe_tokens
from exactdraft.models.mixers import AttentionMixer
from tests.models.families.test_deepseek_v3 import (
    assert_passes_are_bitwise,
    build_checkpoint,
    load,
    oracle_check,
)
from tests.models.test_moe import hf_logits, relative_error

GLM4_MOE = dict(
    model_type="glm4_moe", num_hidden_layers=3, num_attention_heads=5, num_key_value_heads=1,
    head_dim=16, n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
    n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
    routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("glm4_moe")), GLM4_MOE)


@pytest.fixture(scope="module")
def target(checkpoint):
    return load(checkpoint)


def test_logits_match_transformers(checkpoint, target):
    tokens = probe_tokens(60, target.vocab_size, salt=3)
    ours = target.forward(target.new_state(), tokens, rows="all")
    assert relative_error(ours, hf_logits(checkpoint, tuple(tokens))) < 2e-5
    c = target.config
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim) == (5, 1, 16, 8)
    assert c.qk_norm and c.attention_bias and c.routing.first_dense == 1
    assert target.layers[1].mixer.output_bias is None  # o_proj has no bias


def test_verify_window_and_chunked_prefill_are_bitwise(target):
    assert_passes_are_bitwise(target)


def test_drafted_equals_serial(target):
    oracle_check(target, True).assert_exact(min_accepted=10, some_rejected=True)


class PlainAttention:
    """A backend whose attention is softmax(q K^T) V over every held key at once, with torch's
    matmuls: the same values, bits that depend on the rows and keys in the pass."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def attention(self, q, keys, values, positions, window, scale, **tree):
        import torch

        last = int(positions.max()) + 1
        group = q.shape[1] // keys.shape[0]
        k = keys[:, :last].repeat_interleave(group, 0)
        v = values[:, :last].repeat_interleave(group, 0)
        scores = torch.einsum("mhd,htd->hmt", q, k) * scale
        hidden = torch.from_numpy(np.arange(last)[None, :] > positions[:, None])
        return torch.einsum("hmt,htd->mhd", scores.masked_fill(hidden, float("-inf"))
                            .softmax(-1), v)


def test_negative_control_plain_attention_is_caught(checkpoint):
    target = load(checkpoint)
    for layer in target.layers:
        mixer = layer.mixer
        assert isinstance(mixer, AttentionMixer)
        mixer.run = (lambda m: lambda be, x, ctx: AttentionMixer.run(m, PlainAttention(be), x,
                                                                     ctx))(mixer)
    assert check_row_invariance(target, 9) is not None
    oracle_check(target, False, seeds=1).assert_caught()
