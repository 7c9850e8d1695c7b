"""The load-time guard: drafting only where multi-row passes are proven to match single steps."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.guard import check_row_invariance, first_difference
from tests.inexact import InexactTorchBackend


@pytest.fixture(scope="module")
def inexact_target(tiny_checkpoints):
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(tiny_checkpoints["llama"]), InexactTorchBackend())


def test_guard_passes_on_the_torch_backend(tiny_targets):
    assert check_row_invariance(tiny_targets["qwen2"], 9) is None
    generator = xd.Generator(tiny_targets["qwen2"], xd.PromptLookup(max_draft=8))
    assert generator.drafting_enabled


def test_inexact_backend_turns_drafting_off_with_a_warning(inexact_target):
    with pytest.warns(RuntimeWarning, match="drafting is off"):
        generator = xd.Generator(inexact_target, xd.PromptLookup(max_draft=4, min_match=1))
    assert not generator.drafting_enabled
    result = generator.generate([5, 6, 7, 5, 6, 7, 5, 6], 12, xd.SamplingParams(seed=1))
    assert result.stats.drafting is False
    assert "differs from the single step" in result.stats.drafting_note
    assert result.stats.drafted == 0
    serial = generator.generate([5, 6, 7, 5, 6, 7, 5, 6], 12, xd.SamplingParams(seed=1),
                                drafts=False)
    assert result.tokens == serial.tokens
    assert serial.stats.drafting_note is None  # nothing was asked of the drafter


def test_strict_mode_raises(inexact_target):
    with pytest.raises(xd.ExactnessError, match="differs"):
        xd.Generator(inexact_target, xd.PromptLookup(max_draft=4), strict=True)


def test_no_drafter_needs_no_guard(inexact_target):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert xd.Generator(inexact_target).drafting_note is None


def test_first_difference_reports_bits():
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    b = a.copy()
    assert first_difference(a, b) is None
    b[1] = np.nextafter(b[1], np.float32(3))
    assert "first at flat index 1" in first_difference(a, b)
    # -0.0 == 0.0 as numbers but not as bits.
    assert first_difference(np.array([0.0]), np.array([-0.0])) is not None
