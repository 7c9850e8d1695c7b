"""How to pin sampling reproducibility in your own test suite with exactdraft.testing.

    pytest examples/test_reproducibility.py

The venv scripts/demo.sh makes has pytest; elsewhere `pip install pytest` first. In a real
project, commit the recording file and drop the recording fixture: the test then fails the day
a dependency, kernel or setting changes a single sampled token.
"""

import pytest

import exactdraft as xd
from exactdraft.testing import assert_drafted_equals_serial, assert_reproduces, record_generation

PROMPT = [{"role": "user", "content": "Name three prime numbers."}]


@pytest.fixture(scope="module")
def generator():
    return xd.Generator.from_pretrained(drafter=xd.PromptLookup())


def test_drafts_never_change_the_output(generator):
    assert_drafted_equals_serial(generator, [PROMPT], seeds=[0, 1],
                                 sampling=xd.SamplingParams(temperature=0.8, top_p=0.95),
                                 max_new_tokens=24)


def test_generation_replays_exactly(generator, tmp_path):
    recording = tmp_path / "prime_numbers.json"  # commit such a file in a real suite
    record_generation(generator, str(recording), PROMPT, max_new_tokens=24,
                      sampling=xd.SamplingParams(temperature=0.8, seed=1234))
    assert_reproduces(generator, str(recording))
