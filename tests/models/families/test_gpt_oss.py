"""The gpt-oss family on a tiny random checkpoint (odd KV head count, sliding and full layers,
YaRN rope, clamped experts): logits against transformers, with controls that leave out each of
the family's own parts; a verify window and chunked prefill bit for bit, and drafted output
equal to serial output at temperature 0.8, each with a negative control whose sinks scale the
backend's attention on the host as the reference does it, for the whole pass in float32 (the
same function, other bits); token-tree rows equal serial steps over their paths (the same
control, with the sink summed over the tree's slots); an imported KV prefix continues with one
pass's bits; OpenAI's MXFP4 experts; the padded torch and the mlx backends (its ops and its
shaders); the sink across several key blocks against the softmax; a backend without sinks
refused."""

from __future__ import annotations

import functools
import json
import shutil

import numpy as np
import pytest

from exactdraft.errors import BackendError, ConfigError, WeightError
from exactdraft.guard import probe_tokens
from exactdraft.models import attention_sinks
from exactdraft.models.families.gpt_oss import config_from_hf
from tests.exactness import ExactnessCheck
from tests.models.test_token_tree import SHAPES, path_to, serial_rows
from tests.test_generator import every_family, oracle_drafts

SETTINGS = dict(
    model_type="gpt_oss", num_attention_heads=9, num_key_value_heads=3, head_dim=16,
    num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, sliding_window=12,
    swiglu_limit=1.5, max_position_embeddings=128,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 32})
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 10, 11, 12, 5, 6, 7, 8, 9]  # past the sliding window
LENGTH = 70  # past the sliding window and the sink sum's first block of keys


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    from tests.conftest import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("gpt_oss")), "llama", **SETTINGS)


@pytest.fixture(scope="module")
def target(folder):
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(folder), "torch")


@functools.cache
def hf_logits(folder: str, tokens: tuple[int, ...]) -> np.ndarray:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([list(tokens)])).logits[0].numpy()


def relative_error(target, folder: str) -> float:
    tokens = probe_tokens(LENGTH, target.vocab_size, salt=3)
    ours = target.forward(target.new_state(), tokens, rows="all")
    reference = hf_logits(folder, tuple(tokens))
    scale = float(np.abs(reference).max())
    assert scale > 1.0  # the logits spread over several units
    return float(np.abs(ours - reference).max()) / scale


def test_config_maps_the_family(target):
    c = target.config
    assert (c.num_heads, c.num_kv_heads, c.num_experts, c.top_k) == (9, 3, 4, 2)
    assert c.sliding_windows == (12, 0)
    from exactdraft.models.yarn import yarn_attention_factor

    assert c.yarn.factor == 4.0 and yarn_attention_factor(c.yarn) == pytest.approx(
        0.1 * np.log(4.0) + 1.0)


def test_logits_match_transformers(target, folder):
    assert relative_error(target, folder) < 2e-5


def _without_sinks(target):
    for layer in target.layers:
        layer.mixer = layer.mixer.attention


def _without_clamp(target):
    for layer in target.layers:
        for expert in layer.feed_forward.experts:
            expert.limit = 1e9


def _without_attention_factor(target):
    target.layers[0].mixer.attention.rope.factor = np.float32(1.0)


@pytest.mark.parametrize("leave_out", [_without_sinks, _without_clamp,
                                       _without_attention_factor])
def test_control_each_part_left_out_is_seen(leave_out, folder):
    from exactdraft.pretrained import build_target, load_checkpoint

    changed = build_target(load_checkpoint(folder), "torch")
    leave_out(changed)
    assert relative_error(changed, folder) > 1e-3


def verify_and_chunk_mismatches(target) -> list[str]:
    """Where a verify window's rows or a chunked prefill's rows differ from single steps and
    one pass."""
    prefix = probe_tokens(LENGTH - 10, target.vocab_size, salt=1)
    window = probe_tokens(9, target.vocab_size, salt=2)
    state, mismatches = target.new_state(), []
    target.forward(state, prefix)
    singles = [target.forward(state, [token])[0].tobytes() for token in window]
    for width in range(1, 10):
        target.truncate(state, len(prefix))
        rows = target.forward(state, window[:width], rows="all")
        if [row.tobytes() for row in rows] != singles[:width]:
            mismatches.append(f"verify width {width}")
    tokens = prefix + window
    whole = target.forward(target.new_state(), tokens, rows="all")
    chunked, begin = target.new_state(), 0
    for size in (1, 6, 13, 19, 30):
        rows = target.forward(chunked, tokens[begin:begin + size], rows="all")
        if rows.tobytes() != whole[begin:begin + size].tobytes():
            mismatches.append(f"chunk at {begin}")
        begin += size
    return mismatches


def test_verify_window_and_chunked_prefill_are_bitwise(target):
    assert verify_and_chunk_mismatches(target) == []


def test_an_imported_prefix_continues_with_the_bits_of_one_pass(target):
    """A prefix's keys and values exported and imported into a new state (the exact prefix
    cache) give the rows after it the bits of one pass over the whole text; the control
    imports a prefix with one token changed and gets other bits."""
    tokens = probe_tokens(LENGTH, target.vocab_size, salt=9)
    whole = target.forward(target.new_state(), tokens, rows="all")

    def continued(prefix: list[int]) -> bytes:
        source = target.new_state()
        target.forward(source, prefix)
        imported = target.new_state()
        target.import_kv(imported, *target.export_kv(source, 0, 40))
        return target.forward(imported, tokens[40:], rows="all").tobytes()

    assert continued(tokens[:40]) == whole[40:].tobytes()
    changed = list(tokens[:40])
    changed[35] = (changed[35] + 1) % target.vocab_size
    assert continued(changed) != whole[40:].tobytes()


def plain_sink_scales(q, keys, positions, window, scale, sinks):
    """The sink's scale Z / (Z + exp(sink - m)) as the reference computes it, for the rows
    of the whole pass at once in float32 (one stabiliser per head) over the keys in their
    slots: the same function, bits that follow the pass."""
    group = q.shape[1] // keys.shape[0]
    key_positions = np.arange(keys.shape[1])
    seen = key_positions[None, :] <= positions[:, None]
    if window > 0:
        seen &= positions[:, None] - key_positions[None, :] < window
    scores = np.einsum("mhd,hld->mhl", q, np.repeat(keys, group, axis=0)) * np.float32(scale)
    scores = np.where(seen[:, None, :], scores, -np.inf)
    top = np.maximum(scores.max(axis=(0, 2)), sinks)
    total = np.exp(scores - top[None, :, None]).sum(axis=-1)
    return total / (total + np.exp(sinks - top)[None, :])


def plain_sink_attention(self, q, keys, values, positions, window, scale, tree_paths=None):
    """Negative control for attention_sinks._WithSinks.attention: the backend's attention
    without sinks, scaled on the host by plain_sink_scales."""
    be = self._backend
    tree = {} if tree_paths is None else {"tree_paths": tree_paths}
    attended = be.to_host(be.attention(q, keys, values, positions, window, scale, **tree))
    last = int(positions.max()) if tree_paths is None else int(positions[0]) + len(positions) - 1
    scales = plain_sink_scales(be.to_host(q), be.to_host(keys)[:, :last + 1], positions, window,
                               scale, self._sinks)
    return be.vector((attended * scales[..., None]).astype(np.float32))


def test_negative_control_a_plain_sink_scale_breaks_the_bits(target, folder,
                                                                 monkeypatch):
    monkeypatch.setattr(attention_sinks._WithSinks, "attention", plain_sink_attention)
    assert relative_error(target, folder) < 2e-5  # still the same function
    assert verify_and_chunk_mismatches(target)


def drafted_runs(target, guard: bool) -> ExactnessCheck:
    """Drafted against serial at temperature 0.8: every drafter of every_family, and oracle
    drafts (the serial continuation with some tokens wrong) at depths 2, 4 and 6, so that
    multi-row passes keep and reject drafts whatever the tiny model's own acceptance."""
    check = every_family(target, guard, temperatures=(0.8,), seeds=range(2))
    for depth in (2, 4, 6):
        part, _ = oracle_drafts(target, guard, 0.8, 0, 1.0, 0.0, 1.0, 0.0, 0.0, seed=depth,
                                depth=depth, error_rate=0.3, prompt=PROMPT, max_new=24)
        check.flagged_runs |= {check.runs + run for run in part.flagged_runs}
        for name in ("runs", "drafted", "accepted", "token_mismatches", "row_mismatches",
                     "drafting_off"):
            setattr(check, name, getattr(check, name) + getattr(part, name))
    return check


def test_drafted_equals_serial_at_temperature_0_8(target):
    drafted_runs(target, True).assert_exact(min_accepted=10, some_rejected=True)


def test_negative_control_drafted_differs_with_a_plain_sink_scale(target, monkeypatch):
    monkeypatch.setattr(attention_sinks._WithSinks, "attention", plain_sink_attention)
    drafted_runs(target, False).assert_caught(min_fraction=0.3)


def tree_mismatches(target) -> list[str]:
    """Tree rows that differ from serial steps over their paths, for trees whose deep rows
    pass the sliding window, and commits that leave other bits than a serial run."""
    prefix = probe_tokens(LENGTH - 10, target.vocab_size, salt=4)
    mismatches = []
    for salt, (name, parents) in enumerate(SHAPES.items()):
        tokens = probe_tokens(len(parents), target.vocab_size, salt=20 + salt)
        state = target.new_state()
        target.forward(state, prefix)
        tree = target.forward_tree(state, tokens, parents)
        expected = serial_rows(target, prefix, tokens, parents)
        mismatches += [f"{name} row {row}" for row in range(len(parents))
                       if tree[row].tobytes() != expected[row]]
        path = path_to(parents, len(parents) - 1)
        target.commit_tree(state, path)
        serial = target.new_state()
        target.forward(serial, prefix + [tokens[node] for node in path])
        if target.forward(state, [7, 8], rows="all").tobytes() != \
                target.forward(serial, [7, 8], rows="all").tobytes():
            mismatches.append(f"{name} after the commit")
    return mismatches


def test_tree_rows_equal_serial_steps_over_their_paths(target):
    assert target.supports_trees
    assert tree_mismatches(target) == []


def test_negative_control_sinks_summed_by_slot_differ_off_the_first_path(target, monkeypatch):
    """The sink's scale over the tree's slots in order (siblings and cousins included) and
    the whole pass instead of the row's path: tree rows get other bits."""
    monkeypatch.setattr(attention_sinks._WithSinks, "attention", plain_sink_attention)
    assert "two-branches row 2" in tree_mismatches(target)


def base_config() -> dict:
    return dict(model_type="gpt_oss", vocab_size=128, hidden_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
                num_local_experts=4, num_experts_per_tok=2)


def test_config_defaults_and_refusals():
    c = config_from_hf(base_config(), "config.json")
    assert c.sliding_windows == (128, 0, 128) and c.yarn is None and c.attention_bias
    for change, match in ((dict(num_experts_per_tok=5), "num_experts_per_tok"),
                          (dict(num_key_value_heads=3), "num_attention_heads"),
                          (dict(layer_types=["full_attention"]), "layer_types"),
                          (dict(rope_parameters={"rope_type": "llama3", "factor": 8.0}),
                           "rope_type")):
        with pytest.raises(ConfigError, match=match):
            config_from_hf({**base_config(), **change}, "config.json")


E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0,
                 -4.0, -6.0])


def openai_mxfp4(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A [..., N, K] matrix as OpenAI's MXFP4 blocks [..., N, K / 32, 16] (byte j: weight 2j in
    the low nibble, 2j + 1 in the high one) and e8m0 scales [..., N, K / 32]."""
    groups = weight.reshape(*weight.shape[:-1], -1, 32).astype(np.float64)
    top = np.maximum(np.abs(groups).max(axis=-1), 1e-30)
    scales = np.clip(np.floor(np.log2(top)) - 2 + 127, 1, 254).astype(np.uint8)
    scaled = groups / np.exp2(scales.astype(np.float64) - 127)[..., None]
    codes = np.abs(scaled[..., None] - E2M1).argmin(axis=-1).astype(np.uint8)
    return (np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4)),
            np.ascontiguousarray(scales))


def mxfp4_copies(folder: str, destination) -> tuple[str, str]:
    """(a copy with every expert in MXFP4 blocks, a float32 copy of the same values as
    transformers dequantizes them)."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from tests.hybrid_checkpoints import edit_tensors

    packed = shutil.copytree(folder, destination / "mxfp4")
    dense = shutil.copytree(folder, destination / "dense")
    blocks_of = {}

    def to_blocks(tensors: dict) -> None:
        for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
            stored = tensors.pop(name)  # [E, K, N]
            blocks, scales = openai_mxfp4(np.swapaxes(stored, 1, 2))
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
            blocks_of[name] = (blocks, scales)

    def to_dense(tensors: dict) -> None:
        for name, (blocks, scales) in blocks_of.items():
            tensors[name] = convert_moe_packed_tensors(
                torch.from_numpy(blocks), torch.from_numpy(scales),
                dtype=torch.float32).numpy()

    edit_tensors(str(packed), to_blocks)
    config_path = packed / "config.json"  # as OpenAI's checkpoints say it
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    config_path.write_text(json.dumps(config))
    edit_tensors(str(dense), to_dense)
    return str(packed), str(dense)


def test_mxfp4_experts_load_to_the_bits_of_their_dequantized_values(folder, tmp_path,
                                                                   monkeypatch):
    """OpenAI's MXFP4 experts, read as GGUF mxfp4 blocks, hold exactly the float32 values
    transformers dequantizes them to (their logits bit for bit), and kept in their blocks they
    run within the int8 activations' error of them; the control that copies OpenAI's nibble
    order unchanged does neither."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.models import clamped_experts
    from exactdraft.pretrained import build_target, load_checkpoint

    packed, dense = mxfp4_copies(folder, tmp_path)
    tokens = probe_tokens(40, 128, salt=5)

    def logits(path: str, dequantized: bool = True) -> np.ndarray:
        # float32 activations: mxfp4 has no float kernel, so the blocks' exact values multiply
        backend = TorchCPUBackend(quantized_activations=not dequantized)
        target = build_target(load_checkpoint(path), backend)
        return target.forward(target.new_state(), tokens, rows="all")

    reference = logits(dense)
    assert logits(packed).tobytes() == reference.tobytes()
    scale = np.abs(reference).max()
    assert np.abs(reference - hf_logits(dense, tuple(tokens))).max() / scale < 2e-5
    # Kept in their blocks, the experts run on the integer-dot kernels (int8 activations).

    def mean_error(quantized: np.ndarray) -> float:
        # A mean: int8 activations may flip a token's expert choice, moving its row far.
        return float(np.abs(quantized - reference).mean() / np.abs(reference).mean())

    assert mean_error(logits(packed, dequantized=False)) < 3e-2

    def nibbles_as_stored(blocks, scales):
        blocks = np.asarray(blocks, dtype=np.uint8)
        data = np.concatenate([np.asarray(scales, dtype=np.uint8)[..., None], blocks], axis=-1)
        rows, groups = blocks.shape[:2]
        return clamped_experts.QuantizedTensor("mxfp4", data.reshape(rows, groups * 17),
                                               (rows, groups * 32))

    monkeypatch.setattr(clamped_experts, "mxfp4_rows", nibbles_as_stored)
    assert logits(packed).tobytes() != reference.tobytes()
    assert mean_error(logits(packed, dequantized=False)) > 3e-2


def test_mxfp4_experts_need_whole_blocks(folder, tmp_path):
    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.hybrid_checkpoints import edit_tensors

    packed, _ = mxfp4_copies(folder, tmp_path)
    edit_tensors(packed, lambda t: t.update({
        "model.layers.0.mlp.experts.down_proj_scales": np.zeros((4, 64, 2), np.uint8)}))
    with pytest.raises(WeightError, match="down_proj_scales"):
        build_target(load_checkpoint(packed), "torch")


def test_the_padded_torch_backend_keeps_the_sinks_and_the_bits(folder):
    """The torch ops backend (the C kernels' reference) takes the sinks in its attention
    too: it matches transformers and keeps rows invariant."""
    from exactdraft.pretrained import build_target, load_checkpoint

    padded = build_target(load_checkpoint(folder), "torch-padded")
    assert type(padded.backend).__name__ == "TorchBackend"
    assert relative_error(padded, folder) < 2e-5
    assert verify_and_chunk_mismatches(padded) == []


@pytest.mark.parametrize("shaders", [None, "emulator"])
def test_the_mlx_backend_keeps_the_sinks_and_the_bits(folder, shaders):
    """MLX's own ops and its attention shader (on the emulator) take the sinks in their
    attention: the model matches transformers and keeps rows invariant on both."""
    pytest.importorskip("mlx.core", reason="mlx is not installed (Linux: pip install 'mlx[cpu]')")
    if shaders and shutil.which("c++") is None:
        pytest.skip("the shader emulator needs a C++ compiler (c++)")
    from exactdraft.backends.mlx_backend import MLXBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(folder), MLXBackend(shaders=shaders))
    assert relative_error(target, folder) < 2e-5
    assert verify_and_chunk_mismatches(target) == []


@pytest.mark.parametrize("window", [0, 300])
def test_sink_attention_across_key_blocks_matches_the_softmax_and_keeps_rows_alone(target,
                                                                                 window):
    """Rows over several blocks of keys (and a window starting inside one): each row's bits
    equal its bits alone, and the rows equal softmax over [scores, sink] times the values in
    float64, to float32 rounding."""
    be, rng = target.backend, np.random.default_rng(window)
    heads, kv_heads, dim, positions = 6, 2, 16, np.arange(700, 709)
    sinks = rng.normal(size=heads).astype(np.float32) * 2
    q = rng.normal(size=(positions.size, heads, dim)).astype(np.float32)
    keys, values = (rng.normal(size=(kv_heads, 1024, dim)).astype(np.float32)
                    for _ in range(2))
    view = attention_sinks._WithSinks(be, sinks)

    def attend(rows: slice) -> np.ndarray:
        return be.to_host(view.attention(be.vector(q[rows]), be.vector(keys),
                                         be.vector(values), positions[rows], window, 0.25))

    together = attend(slice(None))
    alone = np.concatenate([attend(slice(r, r + 1)) for r in range(positions.size)])
    assert together.tobytes() == alone.tobytes()
    for r, p in enumerate(positions):
        first = max(0, p - window + 1) if window else 0
        for h in range(heads):
            k, v = keys[h // 3, first:p + 1], values[h // 3, first:p + 1]
            logits = np.append(k.astype(np.float64) @ q[r, h] * 0.25, sinks[h])
            weights = np.exp(logits - logits.max())
            reference = weights[:-1] @ v / weights.sum()
            assert np.abs(together[r, h] - reference).max() < 1e-5


def test_a_backend_whose_attention_takes_no_sinks_is_refused(folder):
    """A backend that does not declare attention_sinks (a registered one, MLX's shaders) is
    refused when the model is built, naming the model and the backend."""
    from exactdraft.backends.torch_backend import TorchBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    class WithoutSinks(TorchBackend):
        attention_sinks = False

    with pytest.raises(BackendError, match="gpt-oss model .* has attention sinks"):
        build_target(load_checkpoint(folder), WithoutSinks())
