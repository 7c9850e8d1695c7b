"""exactdraft's own float64 exp, log, sin and cos: the C twins give the Python bits, and both
stay within a couple of ulps of the C library's correctly rounded results."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exactdraft import float64_math
from exactdraft.sampling import native as sampling_native

NATIVE = pytest.mark.skipif(not sampling_native.available(),
                            reason=str(sampling_native.unavailable_reason()))


def probes(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "exp": np.concatenate([rng.uniform(-745, 709, 20000), rng.uniform(-40, 0, 20000),
                               rng.uniform(-1e-3, 1e-3, 2000), [0.0, -0.0, 709.78, -745.13]]),
        "log": np.concatenate([rng.random(20000), rng.uniform(0.5, 2.0, 20000),
                               10.0 ** rng.uniform(-300, 300, 20000), 1 - rng.random(2000) * 1e-9,
                               [1.0, 2.0, 0.5, 5e-324, 2.2e-308, 1.7e308, 2.0 ** -54]]),
    }


@NATIVE
@pytest.mark.parametrize("name", ["exp", "log"])
def test_the_c_twins_give_the_python_bits(name):
    native = getattr(sampling_native._native, name)
    for seed in range(3):
        x = np.ascontiguousarray(probes(seed)[name])
        ours = getattr(float64_math, name)(x)
        assert np.array_equal(np.array(native(x)).view(np.uint64), ours.view(np.uint64))


@NATIVE
def test_special_values_agree():
    x = np.array([np.nan, np.inf, -np.inf, 800.0, -800.0, 0.0, -0.0, -1.0])
    for name in ("exp", "log"):
        ours = getattr(float64_math, name)(x)
        native = np.array(getattr(sampling_native._native, name)(x))
        assert np.array_equal(np.isnan(ours), np.isnan(native)), name
        assert np.array_equal(ours[~np.isnan(ours)], native[~np.isnan(native)]), name


def ulps(ours: np.ndarray, reference: np.ndarray) -> float:
    spacing = np.spacing(np.abs(reference))
    return float(np.max(np.abs(ours - reference) / spacing))


@pytest.mark.parametrize("name", ["exp", "log"])
def test_within_two_ulps_of_the_c_library(name):
    x = probes(7)[name]
    x = x[(x > -700) & (x < 700)] if name == "exp" else x[x > 2.3e-308]
    reference = np.array([getattr(math, name)(v) for v in x.tolist()])
    assert ulps(getattr(float64_math, name)(x), reference) <= 2.0


def test_sin_and_cos_within_two_ulps_on_rope_angles():
    rng = np.random.default_rng(3)
    angles = np.concatenate([rng.uniform(0, 8, 20000), rng.uniform(0, 131072, 20000),
                             np.arange(0, 4096) * 0.7071])
    for name in ("sin", "cos"):
        ours = getattr(float64_math, name)(angles)
        reference = np.array([getattr(math, name)(v) for v in angles.tolist()])
        # Near a zero of the function the relative error grows; compare absolutely there.
        error = np.abs(ours - reference)
        assert np.all(error <= 2.0 * np.maximum(np.spacing(np.abs(reference)), 2.0 ** -60)), name


def test_power_matches_the_c_library_closely():
    y = np.arange(0, 128, 2, dtype=np.float64) / 128
    for base in (10000.0, 500000.0, 1e6):
        ours = float64_math.power(base, y)
        reference = np.array([base ** v for v in y.tolist()])
        assert np.max(np.abs(ours / reference - 1)) < 1e-14


def test_logistic_functions_match_the_c_library_closely():
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-40, 40, 20000), rng.uniform(-1e-6, 1e-6, 2000),
                        [0.0, -0.0, 19.999, 20.0, 20.001, -700.0, 700.0]])
    sigmoid = np.array([1.0 / (1.0 + math.exp(-v)) for v in x.tolist()])
    assert np.max(np.abs(float64_math.sigmoid(x) - sigmoid) / sigmoid) < 1e-15
    softplus = np.array([v if v > 20 else math.log1p(math.exp(v)) for v in x.tolist()])
    assert np.max(np.abs(float64_math.softplus(x) - softplus) / softplus) < 1e-15
    u = np.concatenate([10.0 ** rng.uniform(-300, 2, 20000), -rng.random(2000) * 0.99])
    log1p = np.array([math.log1p(v) for v in u.tolist()])
    assert ulps(float64_math.log1p(u), log1p) <= 3.0
