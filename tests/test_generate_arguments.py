"""The first hour with the Python API: sampling keywords, one default, generation_config.json,
misuse named before loading, Ctrl-C in a stream, and progress on a terminal only."""

from __future__ import annotations

import io
import json
import shutil

import pytest

import exactdraft as xd
from exactdraft import pretrained
from exactdraft.progress import Progress

PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]


@pytest.fixture(scope="module")
def generator(tiny_targets):
    return xd.Generator(tiny_targets["llama"], xd.PromptLookup(min_match=1))


def test_sampling_keywords_are_shorthand_for_sampling_params(generator):
    params = xd.SamplingParams(temperature=0.7, top_p=0.9, seed=1)
    expected = generator.generate(PROMPT, 16, params, stop_tokens=[])
    shorthand = generator.generate(PROMPT, temperature=0.7, top_p=0.9, seed=1, max_tokens=16,
                                   stop_tokens=[])
    assert shorthand.tokens == expected.tokens and len(shorthand.tokens) == 16
    as_dict = generator.generate(PROMPT, 16, {"temperature": 0.7, "top_p": 0.9, "seed": 1},
                                 stop_tokens=[])
    assert as_dict.tokens == expected.tokens
    streamed = [t for chunk in generator.stream(PROMPT, temperature=0.7, top_p=0.9, seed=1,
                                                max_tokens=16, stop_tokens=[])
                for t in chunk.tokens]
    assert streamed == expected.tokens


def test_sampling_params_may_come_second_as_in_vllm(generator):
    """`generate(prompt, sampling_params)` (vLLM's positional form) reads the SamplingParams
    (or dict) as the sampling, its max_tokens included, and takes max_tokens= beside it;
    stream does the same. Control: an integer second argument is still max_new_tokens."""
    params = xd.SamplingParams(temperature=0.7, seed=1, max_tokens=9)
    expected = generator.generate(PROMPT, sampling=params, stop_tokens=[])
    assert len(expected.tokens) == 9
    assert generator.generate(PROMPT, params, stop_tokens=[]).tokens == expected.tokens
    assert generator.generate(PROMPT, {"temperature": 0.7, "seed": 1, "max_tokens": 9},
                              stop_tokens=[]).tokens == expected.tokens
    shorter = generator.generate(PROMPT, params, max_tokens=4, stop_tokens=[])
    assert shorter.tokens == expected.tokens[:4]
    streamed = [t for chunk in generator.stream(PROMPT, params, stop_tokens=[])
                for t in chunk.tokens]
    assert streamed == expected.tokens
    assert len(generator.generate(PROMPT, 5, params, stop_tokens=[]).tokens) == 5


def test_an_unknown_from_pretrained_option_lists_every_valid_one(tiny_checkpoints):
    with pytest.raises(xd.ParameterError) as refused:
        xd.Generator.from_pretrained(tiny_checkpoints["llama"], keep_quantised=True)
    listed = str(refused.value).split("valid options: ")[1].split(", ")
    for name in ("device", "dtype", "backend", "drafter", "strict", "progress", "max_context",
                 "keep_quantized", "prefill_chunk", "tensor_parallel"):
        assert name in listed, name
    assert "path_or_id" not in listed and "options" not in listed


@pytest.mark.parametrize("call,match", [
    (dict(sampling=xd.SamplingParams(seed=1), temperature=0.5), "both sampling= and temperature="),
    (dict(max_new_tokens=4, max_tokens=4), "both max_new_tokens= and max_tokens="),
    (dict(sampling={"temprature": 0.5}), "unknown sampling setting 'temprature'; valid settings: "
                                          "temperature, top_k"),
    (dict(sampling=0.7), "sampling must be a SamplingParams or a dict"),
    (dict(top_p=1.5), "top_p must be in"),
    (dict(max_tokens=-2), "max_tokens must be an integer >= 0"),
    (dict(logit_bias={5: 1e308}), r"logit_bias\[5\] must lie in \[-1e\+09, 1e\+09\]"),
    (dict(logit_bias={500: 1.0}), "logit_bias token id 500 is outside the vocabulary"),
    (dict(stop_tokens=[2, 128]), "stop token id 128 is outside the vocabulary"),
    (dict(stop_tokens=2), "stop_tokens must be a list of token ids"),
    (dict(drafts="no"), "drafts must be True or False"),
])
def test_bad_generate_arguments_raise_parameter_error_and_leave_it_usable(generator, call,
                                                                          match):
    before = generator.generate(PROMPT, 6, seed=2)
    with pytest.raises(xd.ParameterError, match=match):
        generator.generate(PROMPT, **call)
    with pytest.raises(xd.ParameterError, match=match):
        generator.stream(PROMPT, **call)
    assert generator.generate(PROMPT, 6, seed=2).tokens == before.tokens


def test_sampling_params_errors_are_parameter_errors():
    for bad in (dict(temperature=-1), dict(top_k=-1), dict(presence_penalty=2e9),
                dict(repetition_penalty=1e-12), dict(logit_bias={1: float("inf")}),
                dict(logit_bias=[1, 2]), dict(seed=-1)):
        with pytest.raises(xd.ParameterError):
            xd.SamplingParams(**bad)
    assert issubclass(xd.ParameterError, ValueError)
    assert xd.SamplingParams(logit_bias={5: -1e9}).logit_bias == {5: -1e9}  # a ban


def test_one_default_for_sampling(generator, tiny_targets):
    assert generator.sampling == xd.SamplingParams()  # temperature 1.0, no filters
    default = generator.generate(PROMPT, 12, seed=4, stop_tokens=[])
    assert default.tokens == generator.generate(PROMPT, 12, xd.SamplingParams(seed=4),
                                                stop_tokens=[]).tokens
    greedy = xd.Generator(tiny_targets["llama"], sampling={"temperature": 0.0})
    assert greedy.sampling.temperature == 0.0
    # Keywords change only the fields they name, over the Generator's default.
    assert greedy.generate(PROMPT, 12, top_k=3, stop_tokens=[]).tokens == \
        greedy.generate(PROMPT, 12, xd.SamplingParams(temperature=0.0, top_k=3),
                        stop_tokens=[]).tokens


def _folder_with_generation_config(tiny_checkpoints, tmp_path, config):
    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoints["llama"], folder)
    (folder / "generation_config.json").write_text(json.dumps(config))
    return str(folder)


def test_generation_config_sets_the_defaults(tiny_checkpoints, tmp_path):
    folder = _folder_with_generation_config(tiny_checkpoints, tmp_path, {
        "do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
        "eos_token_id": [2, 7], "max_length": 20})
    generator = xd.Generator.from_pretrained(folder, "torch", progress=False)
    assert generator.sampling == xd.SamplingParams(temperature=0.6, top_p=0.9, top_k=20)
    assert set(generator.stop_tokens) == {2, 7}
    own = xd.Generator.from_pretrained(folder, "torch", sampling={"temperature": 0.0},
                                       progress=False)
    assert own.sampling == xd.SamplingParams(temperature=0.0)


def test_generation_config_greedy_and_bad_values(tiny_checkpoints, tmp_path):
    folder = _folder_with_generation_config(tiny_checkpoints, tmp_path, {
        "do_sample": False, "temperature": 0.6, "top_p": 7.0, "eos_token_id": 99999})
    with pytest.warns(RuntimeWarning) as caught:
        generator = xd.Generator.from_pretrained(folder, "torch", progress=False)
    messages = " ".join(str(w.message) for w in caught)
    assert "generation_config.json: ignoring top_p" in messages
    assert "ignoring eos_token_id 99999" in messages
    assert generator.sampling.temperature == 0.0 and 99999 not in generator.stop_tokens


def test_from_pretrained_misuse_is_named_before_loading(tiny_checkpoints, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("loaded a checkpoint before checking the arguments")

    monkeypatch.setattr(pretrained, "load_checkpoint", no_loading)
    folder = tiny_checkpoints["llama"]
    cases = [
        ((folder, xd.PromptLookup()), {}, "got a drafter .* as `backend`; pass it as drafter="),
        ((xd.PromptLookup(),), {}, "got a drafter .* as the model"),
        ((folder,), dict(drafter="lookup"), "drafter must be a Drafter such as PromptLookup"),
        ((folder,), dict(backend=3), "backend must be a name"),
        ((folder,), dict(max_context="big"), "max_context must be an integer"),
        ((folder,), dict(strict="yes"), "strict must be True or False"),
        ((folder,), dict(prefill_chunk=0), "prefill_chunk must be an integer >= 1"),
        ((folder,), dict(sampling={"top_p": 2}), "top_p must be in"),
        ((folder,), dict(keep_quantised=True),
         "unknown option 'keep_quantised'; valid options: .*keep_quantized"),
        ((folder,), dict(backend="nonesuch"), "unknown backend 'nonesuch'"),
        ((12,), {}, "the model must be a path or a hub id"),
    ]
    for args, options, match in cases:
        with pytest.raises(xd.ExactdraftError, match=match):
            xd.Generator.from_pretrained(*args, **options)


def test_generator_misuse_is_named(tiny_targets):
    target = tiny_targets["llama"]
    with pytest.raises(xd.ParameterError, match="Generator.from_pretrained"):
        xd.Generator("path/to/model")
    with pytest.raises(xd.ParameterError, match=r"wrap it: DraftModel\(model\)"):
        xd.Generator(target, tiny_targets["llama-tied"])
    with pytest.raises(xd.ParameterError, match="guard must be True or False"):
        xd.Generator(target, guard="off")
    with pytest.raises(xd.ParameterError, match="tokenizer must be"):
        xd.Generator(target, tokenizer="gpt2")


class _Interrupting:
    """A target whose forward raises KeyboardInterrupt on its `at`-th call (as Ctrl-C would)."""

    def __init__(self, target, at):
        self.target, self.at, self.calls = target, at, 0

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward(self, state, tokens, rows="last"):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.target.forward(state, tokens, rows=rows)


def test_ctrl_c_in_the_consumer_keeps_what_it_received(generator):
    full = generator.generate(PROMPT, 30, seed=5, stop_tokens=[])
    stream = generator.stream(PROMPT, 30, seed=5, stop_tokens=[])
    received = []
    with pytest.raises(KeyboardInterrupt):
        for index, chunk in enumerate(stream):
            received.extend(chunk.tokens)
            if index == 3:
                raise KeyboardInterrupt
    partial = stream.result
    assert partial.finish_reason == "interrupted" and partial.tokens == received
    assert received == full.tokens[:len(received)] and 0 < len(received) < 30
    assert generator.generate(PROMPT, 30, seed=5, stop_tokens=[]).tokens == full.tokens


def test_ctrl_c_inside_a_model_pass_keeps_the_partial_result(tiny_targets):
    target = tiny_targets["llama"]
    full = xd.Generator(target).generate(PROMPT, 20, seed=6, stop_tokens=[])
    interrupting = _Interrupting(target, at=8)
    generator = xd.Generator(interrupting)
    stream = generator.stream(PROMPT, 20, seed=6, stop_tokens=[])
    received = []
    with pytest.raises(KeyboardInterrupt):
        for chunk in stream:
            received.extend(chunk.tokens)
    assert stream.result.tokens == received == full.tokens[:len(received)]
    assert stream.result.stats.generated_tokens == len(received) > 0
    with pytest.raises(KeyboardInterrupt):  # generate keeps nothing, and says so in its doc
        interrupting.calls = 0
        generator.generate(PROMPT, 20, seed=6, stop_tokens=[])
    interrupting.at = -1
    assert generator.generate(PROMPT, 20, seed=6, stop_tokens=[]).tokens == full.tokens
    assert "KeyboardInterrupt" in xd.Generator.generate.__doc__


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_only():
    terminal, pipe = _Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        with Progress("check", stream=stream) as shown:
            shown.phase("starting")
            shown.count(3, 3, "cases")
    assert "exactdraft: check: starting" in terminal.getvalue()
    assert "3/3 cases" in terminal.getvalue() and _erased(terminal.getvalue())
    assert pipe.getvalue() == ""
    with Progress("forced", progress=True, stream=pipe) as shown:
        shown.phase("on")
    assert "forced: on" in pipe.getvalue() and _erased(pipe.getvalue())


def _erased(shown: str) -> bool:
    """Whether the last thing drawn is a blank line ended by a carriage return."""
    return shown.endswith("\r") and shown.rsplit("\r", 2)[-2].strip() == ""


def test_progress_lets_tqdm_auto_decide_and_falls_back_to_plain_lines(monkeypatch):
    import exactdraft.progress as progress

    made = []

    class Bar:
        def __init__(self, **options):
            made.append(options)
            self.disable = options["disable"]

        def set_description_str(self, text, refresh=True):
            made.append(text)

        def close(self):
            made.append("closed")

    monkeypatch.setattr(progress, "_bar_class", lambda: Bar)
    with Progress("loading", stream=io.StringIO()) as shown:  # a notebook: tqdm decides
        shown.phase("reading")
    assert made[0]["disable"] is None and made[0]["leave"] is False
    assert made[1:] == ["exactdraft: loading: reading", "closed"]
    made.clear()
    with Progress("loading", progress=False) as shown:
        shown.phase("reading")
    assert made == []
    monkeypatch.setattr(progress, "_bar_class", lambda: None)  # tqdm not installed
    terminal, pipe = _Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        with Progress("check", stream=stream) as shown:
            shown.phase("starting")
            shown.count(2, 2, "cases")
    lines = terminal.getvalue().splitlines()
    assert [line.rsplit(" (", 1)[0] for line in lines] == ["exactdraft: check: starting",
                                                           "exactdraft: check: 2/2 cases"]
    assert "\r" not in terminal.getvalue() and "\x1b" not in terminal.getvalue()
    assert pipe.getvalue() == ""


def test_loading_and_the_guard_show_progress_when_asked(tiny_checkpoints, capsys):
    xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch", xd.PromptLookup())
    assert capsys.readouterr().err == ""  # stderr is not a terminal here: nothing
    xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch", xd.PromptLookup(),
                                 progress=True)
    err = capsys.readouterr().err
    for phase in ("reading the checkpoint", "building the model", "load-time guard",
                  "measuring verify-pass costs"):
        assert phase in err
    assert _erased(err)


def test_check_and_recording_show_progress_when_asked(generator, tmp_path, capsys):
    from exactdraft.check import check_exactness
    from exactdraft.testing import assert_reproduces, record_generation

    check_exactness(generator, [PROMPT], [0, 1], [xd.SamplingParams()], 8, progress=True)
    assert "check: 2/2 cases done" in capsys.readouterr().err
    path = str(tmp_path / "run.json")
    record_generation(generator, path, PROMPT, 8, {"seed": 1}, progress=True)
    assert "recording run.json" in capsys.readouterr().err
    with open(path) as handle:  # the request-only SamplingParams fields stay out of the file
        assert set(json.load(handle)["sampling"]) == set(xd.sampling.SAMPLING_FIELDS)
    assert_reproduces(generator, path, progress=True)
    assert "replaying run.json" in capsys.readouterr().err
    assert_reproduces(generator, path)
    assert capsys.readouterr().err == ""


# -- the calls people already type -------------------------------------------------------------

PROMPTS = [PROMPT, [9, 8, 7, 9, 8, 7, 9, 8], [3, 4, 5, 3, 4, 5, 3, 4, 5, 3]]


def test_a_list_of_prompts_runs_through_the_engine_and_equals_each_call(generator, monkeypatch):
    from exactdraft.engine.scheduler import Engine

    batches = []
    real = Engine.generate_batch

    def counted(engine, prompts, **options):
        batches.append(len(prompts))
        return real(engine, prompts, **options)

    monkeypatch.setattr(Engine, "generate_batch", counted)
    results = generator.generate(PROMPTS, 12, temperature=0.8, seed=3, stop_tokens=[])
    assert batches == [3] and isinstance(results, list) and len(results) == 3
    for prompt, result in zip(PROMPTS, results):
        alone = generator.generate(prompt, 12, temperature=0.8, seed=3, stop_tokens=[])
        assert result.tokens == alone.tokens and result.seed == 3 and len(result.tokens) == 12
        assert result.prompt_tokens == prompt
    # Negative control: the comparison sees a difference where there is one.
    other = generator.generate(PROMPTS[0], 12, temperature=0.8, seed=4, stop_tokens=[])
    assert other.tokens != results[0].tokens
    assert generator.generate((PROMPT,), 12, seed=3)[0].tokens == \
        generator.generate(PROMPT, 12, seed=3).tokens  # a tuple of one prompt: a list of one


def test_n_returns_n_samples_each_replayable_alone(generator):
    from exactdraft.engine import sample_seed

    samples = generator.generate(PROMPT, 10, n=3, temperature=1.0, seed=11, stop_tokens=[])
    assert isinstance(samples, list) and len(samples) == 3
    for j, sample in enumerate(samples):
        assert sample.seed == sample_seed(11, j)
        assert sample.tokens == generator.generate(PROMPT, 10, temperature=1.0, seed=sample.seed,
                                                   stop_tokens=[]).tokens
    assert len({tuple(s.tokens) for s in samples}) > 1  # the samples differ
    grouped = generator.generate(PROMPTS[:2], 10, num_return_sequences=2, seed=11,
                                 stop_tokens=[])
    assert [len(group) for group in grouped] == [2, 2]
    assert [s.tokens for s in grouped[0]] == [s.tokens for s in samples[:2]]
    from_params = generator.generate(PROMPT, sampling=xd.SamplingParams(n=2, seed=11,
                                                                        max_tokens=10),
                                     stop_tokens=[])
    assert [s.tokens for s in from_params] == [s.tokens for s in samples[:2]]


def test_sampling_params_carry_max_tokens_stop_and_n(generator, tiny_checkpoints):
    assert xd.SamplingParams(stop="x").stop == ("x",)
    with pytest.raises(xd.ParameterError, match="stop strings need a tokenizer"):
        generator.generate(PROMPT, sampling=xd.SamplingParams(stop="x"))  # it reached the call
    params = xd.SamplingParams(temperature=0.9, seed=5, max_tokens=7, n=1)
    assert "max_tokens" not in xd.sampling.SAMPLING_FIELDS
    result = generator.generate(PROMPT, sampling=params, stop_tokens=[])
    assert len(result.tokens) == 7 and result.seed == 5
    run = generator.prepare(PROMPT, sampling=params)
    assert run.params == xd.SamplingParams(temperature=0.9, seed=5) and run.max_new_tokens == 7
    assert len(generator.generate(PROMPT, 3, params, stop_tokens=[]).tokens) == 3  # call wins
    stream = generator.stream(PROMPT, sampling={"max_tokens": 4, "seed": 5}, stop_tokens=[])
    assert len([t for chunk in stream for t in chunk.tokens]) == 4
    texts = xd.Generator.from_pretrained(tiny_checkpoints["qwen2"], "torch", progress=False)
    reply = texts.generate("abcabc", 30, seed=2, temperature=0.8).text
    stop = reply[len(reply) // 2:len(reply) // 2 + 2]
    by_call = texts.generate("abcabc", 30, seed=2, temperature=0.8, stop=stop)
    by_params = texts.generate("abcabc", sampling=xd.SamplingParams(
        seed=2, temperature=0.8, max_tokens=30, stop=[stop]))
    assert by_params.text == by_call.text == reply[:reply.index(stop)]
    assert by_params.finish_reason == "stop"
    for bad, match in ((dict(max_tokens=-1), "max_tokens must be an integer >= 0"),
                       (dict(n=0), "n must be an integer >= 1"),
                       (dict(stop=[""]), "stop must be a non-empty string"),
                       (dict(stop=3), "stop must be a non-empty string")):
        with pytest.raises(xd.ParameterError, match=match):
            xd.SamplingParams(**bad)


def test_do_sample_false_is_greedy_and_foreign_names_map_to_ours(generator):
    greedy = generator.generate(PROMPT, 12, temperature=0, stop_tokens=[])
    assert generator.generate(PROMPT, 12, do_sample=False, seed=9, stop_tokens=[]).tokens == \
        greedy.tokens
    sampled = generator.generate(PROMPT, 12, temperature=0.6, repetition_penalty=1.2, seed=9,
                                 stop_tokens=[2])
    assert generator.generate(PROMPT, 12, temp=0.6, repeat_penalty=1.2, seed=9,
                              eos_token_id=2).tokens == sampled.tokens
    assert generator.generate(PROMPT, 12, temp=0.6, repeat_penalty=1.2, seed=9,
                              stop_token_ids=[2], do_sample=True).tokens == sampled.tokens
    assert generator.generate(PROMPT, sampling_params=xd.SamplingParams(
        temperature=0.6, repetition_penalty=1.2, seed=9, max_tokens=12),
        stop_tokens=[2]).tokens == sampled.tokens
    # Negative control: a different temperature gives different tokens here.
    assert generator.generate(PROMPT, 12, temperature=1.5, repetition_penalty=1.2, seed=9,
                              stop_tokens=[2]).tokens != sampled.tokens


@pytest.mark.parametrize("call,match", [
    (dict(temprature=0.5), "unknown keyword 'temprature'; valid keywords: max_new_tokens, "
                           "max_tokens, sampling, stop, stop_tokens, drafts, logprobs, "
                           "constraint, n, temperature"),
    (dict(max_new_token=5), "unknown keyword 'max_new_token'.*also understood: do_sample"),
    (dict(temp=0.5, temperature=0.5), "both temp= and temperature="),
    (dict(do_sample=False, temperature=0.7), "do_sample=False .greedy. and temperature=0.7"),
    (dict(do_sample=True, temperature=0), "do_sample=True and temperature=0"),
    (dict(do_sample="no"), "do_sample must be True or False"),
    (dict(do_sample=False, sampling=xd.SamplingParams()), "both sampling= and do_sample=False"),
    (dict(sampling_params=xd.SamplingParams(), sampling=xd.SamplingParams()),
     "both sampling= and sampling_params="),
    (dict(stop_strings=["a"], stop=["b"]), "both stop_strings= and stop="),
])
def test_unknown_or_doubled_keywords_name_the_valid_ones(generator, call, match):
    for method in (generator.generate, generator.stream):
        with pytest.raises(xd.ParameterError, match=match):
            method(PROMPT, 4, **call)


def test_stream_takes_one_prompt_and_one_sample(generator):
    with pytest.raises(xd.ParameterError, match="stream.. takes one prompt"):
        generator.stream(PROMPTS)
    with pytest.raises(xd.ParameterError, match="stream.. makes one sample, got n=2"):
        generator.stream(PROMPT, n=2)
    with pytest.raises(xd.ParameterError, match="makes one sample, but the sampling asks for n=2"):
        generator.prepare(PROMPT, sampling=xd.SamplingParams(n=2))


def test_a_bad_prompt_in_a_list_is_named_before_anything_runs(generator, monkeypatch):
    from exactdraft.engine.scheduler import Engine

    monkeypatch.setattr(Engine, "__init__", lambda *a, **k: pytest.fail("the engine started"))
    with pytest.raises(xd.ParameterError, match="prompt token id 999 at index 1"):
        generator.generate([PROMPT, [1, 999]], 4)
    with pytest.raises(xd.ParameterError, match="n must be an integer >= 1, got 0"):
        generator.generate(PROMPT, 4, n=0)


def test_torch_tensor_prompts(generator):
    torch = pytest.importorskip("torch")
    expected = generator.generate(PROMPT, 8, seed=1, stop_tokens=[]).tokens
    flat = torch.tensor(PROMPT)
    assert generator.generate(flat, 8, seed=1, stop_tokens=[]).tokens == expected
    assert generator.generate(flat[None, :], 8, seed=1, stop_tokens=[]).tokens == expected
    assert [r.tokens for r in generator.generate([flat, torch.tensor(PROMPTS[1])], 8, seed=1,
                                                 stop_tokens=[])][0] == expected
    with pytest.raises(xd.ParameterError, match=r"shape \[2, 13\] holds 2 prompts"):
        generator.generate(torch.stack([flat, flat]), 8)
    with pytest.raises(xd.ParameterError, match="must be 1-D or"):
        generator.generate(flat.reshape(1, 1, -1), 8)
    with pytest.raises(xd.ParameterError, match="not a token id"):
        generator.generate(flat.float(), 8)


def test_numpy_prompts_give_the_tokens_of_a_list_of_ints(generator):
    """A list of numpy integer scalars (what indexing an array gives) and a 1-D array are one
    prompt of token ids, as a list of ints is; a list of arrays is several prompts (the
    control that the list-of-prompts reading still applies)."""
    import numpy as np

    expected = generator.generate(PROMPT, 8, seed=1, stop_tokens=[]).tokens
    for prompt in ([np.int64(t) for t in PROMPT], [np.int32(t) for t in PROMPT],
                   list(np.array(PROMPT)), np.array(PROMPT), np.array(PROMPT, dtype=np.int32)):
        assert generator.generate(prompt, 8, seed=1, stop_tokens=[]).tokens == expected
    assert [t for t, _ in zip(generator.stream([np.int64(t) for t in PROMPT], 8, seed=1,
                                               stop_tokens=[]), range(1))]
    several = generator.generate([np.array(PROMPT), np.array(PROMPTS[1])], 8, seed=1,
                                 stop_tokens=[])
    assert [r.tokens for r in several][0] == expected and len(several) == 2
    with pytest.raises(xd.ParameterError, match="not a token id"):
        generator.generate([np.float32(5.0), np.float32(6.0)], 8)


def test_the_repr_names_model_backend_arithmetic_and_drafter(generator, tiny_targets):
    text = repr(generator)
    target = tiny_targets["llama"]
    assert text.startswith(f"Generator(model={type(target).__name__}(llama)")
    assert f"backend={target.backend!r}" in text and f"arithmetic={target.arithmetic!r}" in text
    assert "drafter=PromptLookup(" in text and "drafting on" in text
    assert "drafter=None, serial" in repr(xd.Generator(target))
