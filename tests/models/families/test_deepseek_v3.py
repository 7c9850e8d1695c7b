"""DeepSeek-V3 (deepseek_v3) on a tiny random checkpoint built with transformers (5 heads, yarn
rope with both mscales, interleaved rope pairs, a dense first layer, grouped sigmoid routing
with a correction bias and two shared experts): logits against transformers, a cache of latents
and rope keys only, W-row passes against single steps and chunked against one-pass prefill
(bits), drafted == serial at T=0.8, with a negative control whose multi-row passes expand the
latent into per-head keys and values while one-row steps absorb the up-projections."""

from __future__ import annotations

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.guard import check_row_invariance, probe_tokens
from exactdraft.models.latent_attention import LatentAttention
from exactdraft.models.recurrent import F32
from tests.exactness import ExactnessCheck, OracleDrafter
from tests.models.test_moe import hf_logits, relative_error

DEEPSEEK_V3 = dict(
    model_type="deepseek_v3", num_hidden_layers=3, num_attention_heads=5,
    num_key_value_heads=5, q_lora_rank=24, kv_lora_rank=20, qk_nope_head_dim=12,
    qk_rope_head_dim=8, v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3,
    moe_intermediate_size=32, n_shared_experts=2, n_group=4, topk_group=2,
    first_k_dense_replace=1, routed_scaling_factor=2.5,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                     "original_max_position_embeddings": 256, "mscale": 1.0,
                     "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1})


def build_checkpoint(folder: str, settings: dict) -> str:
    """A tiny random checkpoint of `settings`, its router correction biases set."""
    from tests.conftest import build_tiny_checkpoint
    from tests.hybrid_checkpoints import edit_tensors

    build_tiny_checkpoint(folder, "llama", **settings)
    # transformers leaves the correction bias at zero: give it values that change the choice.
    edit_tensors(folder, lambda t: t.update({
        name: np.linspace(-0.2, 0.2, t[name].shape[0], dtype=np.float32)[::-1].copy()
        for name in t if name.endswith("e_score_correction_bias")}))
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("deepseek_v3")), DEEPSEEK_V3)


def load(folder: str):
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(folder), "torch")


@pytest.fixture(scope="module")
def target(checkpoint):
    return load(checkpoint)


def test_logits_match_transformers(checkpoint, target):
    tokens = probe_tokens(60, target.vocab_size, salt=3)
    ours = target.forward(target.new_state(), tokens, rows="all")
    assert relative_error(ours, hf_logits(checkpoint, tuple(tokens))) < 2e-5


@pytest.mark.slow
def test_logits_match_transformers_without_q_lora_with_biases_and_half_rope(tmp_path):
    """The other layouts a config may choose: q_proj directly (no q_lora_rank), biases on the
    down projections and o_proj, rope pairs in rotate-half order."""
    folder = build_checkpoint(str(tmp_path / "variant"), {
        **DEEPSEEK_V3, "q_lora_rank": None, "attention_bias": True, "rope_interleave": False})
    target = load(folder)
    assert target.config.q_lora_rank == 0 and not target.config.rope_interleave
    tokens = probe_tokens(40, target.vocab_size, salt=3)
    ours = target.forward(target.new_state(), tokens, rows="all")
    assert relative_error(ours, hf_logits(folder, tuple(tokens))) < 2e-5


@pytest.mark.parametrize(("change", "named"), [
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_parameters"),
    ({"n_group": 3}, "n_group"),
    ({"topk_group": 5}, "topk_group"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"topk_method": "group_limited_greedy"}, "topk_method"),
])
def test_a_bad_config_is_refused_by_name(checkpoint, change, named):
    import json

    from exactdraft.errors import ConfigError
    from exactdraft.models.families.deepseek_v3 import config_from_hf

    with open(f"{checkpoint}/config.json") as handle:
        raw = json.load(handle)
    config_from_hf(raw, "config.json")  # the control: as stored, it is read
    with pytest.raises(ConfigError, match=f"config.json: .*{named}"):
        config_from_hf({**raw, **change}, "config.json")


def test_the_config_is_read_as_stored(target):
    c = target.config
    assert (c.num_heads, c.q_lora_rank, c.kv_lora_rank, c.rope_interleave) == (5, 24, 20, True)
    assert c.yarn.factor == 4.0 and c.yarn.mscale_all_dim == 0.707
    r = c.routing
    assert (r.num_experts, r.top_k, r.groups, r.top_groups, r.shared_experts, r.first_dense,
            r.scale) == (8, 3, 4, 2, 2, 1, 2.5)


def test_the_cache_holds_latents_and_rope_keys_only(target):
    c = target.config
    state = target.new_state()
    target.forward(state, probe_tokens(10, target.vocab_size, salt=4))
    cache = state.cache
    assert cache.values is cache.keys  # no separate value buffers
    assert [tuple(buffer.shape)[::2] for buffer in cache.keys] == [(1, 20 + 8)] * 3
    # Per token and layer 28 float32 values, against 2 * 5 heads * 20 key dims of expanded
    # keys and values (the keys are nope + rope wide; values 10, so 5 * (20 + 10) = 150).
    assert c.cache_width == 28


def test_verify_window_and_chunked_prefill_are_bitwise(target):
    assert_passes_are_bitwise(target)


def assert_passes_are_bitwise(target) -> None:
    """Every row of a W-row pass has the bytes of its one-row step, a prompt fed in chunks
    leaves the rows and the cache of one pass, and a sequence sharing a pass with others gets
    the rows it gets alone."""
    tokens = probe_tokens(30, target.vocab_size, salt=1) + probe_tokens(9, 128, salt=2)
    serial = target.new_state()
    steps = [target.forward(serial, [token])[0].tobytes() for token in tokens]
    state = target.new_state()
    target.forward(state, tokens[:30])
    for width in range(1, 10):
        target.truncate(state, 30)
        window = target.forward(state, tokens[30:30 + width], rows="all")
        assert [row.tobytes() for row in window] == steps[30:30 + width], width
    for chunks in ([39], [1] * 5 + [34], [7, 13, 19]):
        state, rows = target.new_state(), []
        for end in np.cumsum(chunks):
            rows += list(target.forward(state, tokens[len(rows):end], rows="all"))
        assert [row.tobytes() for row in rows] == steps, chunks
        assert [np.asarray(buffer[:, :39]).tobytes() for buffer in state.cache.keys] == \
            [np.asarray(buffer[:, :39]).tobytes() for buffer in serial.cache.keys]
    # Sequences sharing a pass: each sequence's rows are the ones it gets alone.
    lists = [tokens[:12], tokens[5:9], tokens[20:39]]
    shared = target.forward_batch([target.new_state() for _ in lists], lists, rows="all")
    for rows, alone in zip(shared, lists):
        assert rows.tobytes() == target.forward(target.new_state(), alone, rows="all").tobytes()
    assert check_row_invariance(target, 9) is None


def oracle_check(target, guard: bool, seeds: int = 3) -> ExactnessCheck:
    """Drafted against serial at T=0.8: oracle drafts, some of them wrong, at depth 4."""
    check = ExactnessCheck()
    serial = xd.Generator(target)
    prompt = [5, 6, 7, 8, 9, 5, 6, 7]
    for seed in range(seeds):
        params = xd.SamplingParams(temperature=0.8, top_p=0.95, seed=seed)
        expected = serial.generate(prompt, 24, params)
        generator = xd.Generator(target, OracleDrafter(expected.tokens, 4, 0.3, seed),
                                 adaptive_depth=False, guard=guard)
        check.compare(generator, prompt, 24, params, serial=serial)
    return check


def test_drafted_equals_serial(target):
    oracle_check(target, True).assert_exact(min_accepted=10, some_rejected=True)


def expanding_passes(mixer: LatentAttention, kv_up: np.ndarray):
    """One-row steps as built (absorbed); a pass of several rows instead expands the cached
    latents into per-head keys W_uk c and values W_uv c and attends with them, as transformers
    does: the same values, other bits."""
    absorbed = mixer.run

    def run(be, x, ctx):
        out = absorbed(be, x, ctx)  # writes the cache; its output is the one-row path's
        count = x.shape[0]
        if count == 1:
            return out
        m, heads = mixer, mixer.num_heads
        nope, latent_dim = m.nope_dim, m.latent_dim
        down = be.linear(x, m.down, m.down_bias)
        q = be.linear(be.rms_norm(down[:, :m.q_rank], m.q_norm, m.eps), m.q_up)
        q = q.reshape(count, heads, nope + m.rope_dim)
        q_rope = be.to_host(be.rope(q[:, :, nope:], *ctx.rope_rows(m.rope)))
        q_nope = be.to_host(q)[:, :, :nope]
        (part,) = ctx.parts
        positions = part.positions()
        cached = be.to_host(part.state.cache.keys[m.kv_slot])[0, :positions[-1] + 1]
        latent, k_rope = cached[:, :latent_dim], cached[:, latent_dim:]
        up = kv_up.reshape(heads, nope + m.value_dim, latent_dim)
        joined = np.empty((count, heads * m.value_dim), F32)
        visible = np.arange(cached.shape[0])[None, :] <= positions[:, None]
        for h in range(heads):
            keys, values = latent @ up[h, :nope].T, latent @ up[h, nope:].T
            scores = (q_nope[:, h] @ keys.T + q_rope[:, h] @ k_rope.T) * F32(m.scale)
            scores = np.where(visible, scores, -np.inf)
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            weights = weights / weights.sum(axis=1, keepdims=True)
            joined[:, h * m.value_dim:(h + 1) * m.value_dim] = weights @ values
        return be.linear(be.vector(joined), m.output, m.output_bias)

    return run


def test_negative_control_expanding_in_passes_is_caught(checkpoint):
    from safetensors.numpy import load_file

    target = load(checkpoint)
    stored = load_file(f"{checkpoint}/model.safetensors")
    for i, layer in enumerate(target.layers):
        layer.mixer.run = expanding_passes(
            layer.mixer, stored[f"model.layers.{i}.self_attn.kv_b_proj.weight"])
    assert check_row_invariance(target, 9) is not None
    prefix, window = probe_tokens(30, 128, salt=1), probe_tokens(6, 128, salt=2)
    state = target.new_state()
    target.forward(state, prefix)
    singles = np.stack([target.forward(state, [token])[0] for token in window])
    target.truncate(state, len(prefix))
    rows = target.forward(state, window, rows="all")
    assert rows.tobytes() != singles.tobytes()
    assert relative_error(rows, singles) < 2e-5  # the same values: only the bits differ
    oracle_check(target, False, seeds=1).assert_caught()
