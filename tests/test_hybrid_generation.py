"""Drafted generation equals serial generation on the mixture-of-experts and hybrid families,
for every drafter (PromptLookup, DraftModel, MTPDrafter in tests/drafters/test_mtp.py), across
temperatures, filters and seeds, with drafts rejected at every depth so that every rollback
length is exercised; compared through tests/exactness.py (tokens and the bytes of every logits
row), with a negative control whose rollback cuts only the KV cache."""

from __future__ import annotations

import pytest

import exactdraft as xd
from tests.conftest import perturbed_copy
from tests.exactness import ExactnessCheck, OracleDrafter
from tests.hybrid_checkpoints import HYBRID_VARIANTS, RECURRENT_FAMILIES
from tests.models.test_hybrid import kv_only_truncate
from tests.test_generator import FILTERS, every_family, oracle_drafts, sampling_grid


@pytest.mark.parametrize("variant", sorted(HYBRID_VARIANTS))
def test_drafted_equals_serial_every_family(variant, hybrid_targets):
    every_family(hybrid_targets(variant), True, temperatures=(0.0, 1.0),
                 seeds=range(2)).assert_exact()


@pytest.mark.parametrize("variant", RECURRENT_FAMILIES)
def test_rejections_at_every_depth(variant, hybrid_targets):
    """Oracle drafts (the serial continuation with a fraction replaced) at depths 1..8: every
    draft position is kept in some passes and rejected in others, so the recurrent state is
    rolled back to every length inside a window."""
    target = hybrid_targets(variant)
    check = ExactnessCheck()
    for depth in range(1, 9):
        temperature, filter_name = [(0.0, "plain"), (0.7, "top_p"), (1.0, "combined")][depth % 3]
        options = dict(FILTERS[filter_name])
        part, _ = oracle_drafts(
            target, True, temperature, options.get("top_k", 0), options.get("top_p", 1.0),
            options.get("min_p", 0.0), options.get("repetition_penalty", 1.0),
            options.get("presence_penalty", 0.0), options.get("frequency_penalty", 0.0),
            seed=depth, depth=depth, error_rate=0.3, prompt=[5, 6, 7, 8, 9, 5, 6, 7],
            max_new=28)
        for name in ("runs", "drafted", "accepted"):
            setattr(check, name, getattr(check, name) + getattr(part, name))
        check.token_mismatches += part.token_mismatches
        check.row_mismatches += part.row_mismatches
        check.drafting_off += part.drafting_off
    check.assert_exact(min_accepted=20, some_rejected=True)


@pytest.fixture(scope="module")
def hybrid_draft_model(hybrid_checkpoints, tmp_path_factory):
    """A draft model close to the tiny qwen3_next target: a hybrid drafting for a hybrid, so
    the draft model's own recurrent state is cut back after every pass."""
    from exactdraft.pretrained import build_target, load_checkpoint

    folder = perturbed_copy(hybrid_checkpoints["qwen3_next"],
                            str(tmp_path_factory.mktemp("qwen3_next-draft")), scale=0.05)
    return build_target(load_checkpoint(folder), "torch")


@pytest.mark.parametrize("temperature,filter_name", [(0.0, "plain"), (0.7, "penalties"),
                                                     (1.5, "top_k")])
def test_sampling_grid_with_a_hybrid_draft_model(temperature, filter_name, hybrid_targets,
                                                 hybrid_draft_model):
    check = sampling_grid(hybrid_targets("qwen3_next"), hybrid_draft_model, True, temperature,
                          filter_name, seeds=range(3))
    check.assert_exact(some_rejected=True)


def test_negative_control_a_kv_only_rollback_changes_the_output(hybrid_checkpoints):
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(hybrid_checkpoints["qwen3_5"]), "torch")
    target.truncate = kv_only_truncate
    check = ExactnessCheck()
    serial = xd.Generator(target)
    for seed in range(4):
        params = xd.SamplingParams(temperature=0.7, seed=seed)
        expected = serial.generate([5, 6, 7, 8, 9, 5, 6], 20, params)
        generator = xd.Generator(target, OracleDrafter(expected.tokens, 4, 0.3, seed),
                                 adaptive_depth=False, guard=False)
        check.compare(generator, [5, 6, 7, 8, 9, 5, 6], 20, params, serial=serial)
    check.assert_caught()
