"""lm-evaluation-harness itself (its `local-completions` model, pinned in the test extra)
running a multiple-choice loglikelihood task on data this test writes, against a live server:
every choice's loglikelihood is the sum of exactdraft.scoring's logprobs of its tokens, and
the greedy flag says whether each was the most probable token, with a local tokenizer folder
or with none (lm-eval then finds the server's /tokenizer_info and /tokenize and tokenizes
through them). Slow job: lm-eval builds a dataset and a task on the way."""

from __future__ import annotations

import json

import pytest

from exactdraft.scoring import score
from tests.server.conftest import MODEL

pytestmark = pytest.mark.slow
lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is not installed")

QUESTIONS = [{"question": "abc abc abc", "choices": ["abc", "xyz", "a b"], "answer": 0},
             {"question": "hello hello", "choices": ["hello", "world"], "answer": 1},
             {"question": "1 2 3 4", "choices": ["5", "6 7", "0"], "answer": 0}]


def write_task(folder) -> None:
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (folder / "task.yaml").write_text(
        "task: exactdraft_choices\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")


def check_scores(results, generator) -> None:
    """Every logged loglikelihood is exactdraft.scoring's, bit for bit."""
    samples = results["samples"]["exactdraft_choices"]
    assert len(samples) == len(QUESTIONS)
    tokenizer = generator.tokenizer
    for sample in samples:
        question = QUESTIONS[sample["doc_id"]]
        context = tokenizer.encode(question["question"], add_special_tokens=False)
        for choice, response in zip(question["choices"], sample["resps"]):
            whole = tokenizer.encode(question["question"] + " " + choice,
                                     add_special_tokens=False)
            assert whole[:len(context)] == context
            scored = score(generator, context, whole[len(context):], temperature=0, top=1)
            loglikelihood, greedy = response[0]
            assert loglikelihood == sum(e.logprob for e in scored)
            assert greedy == all(e.top[0][0] == e.token for e in scored)
    assert 0 <= results["results"]["exactdraft_choices"]["acc,none"] <= 1


def test_a_multiple_choice_task_scores_exactly(live, served_generator, tiny_checkpoints,
                                               tmp_path) -> None:
    from lm_eval.tasks import TaskManager

    base, _ = live
    write_task(tmp_path)
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": MODEL, "base_url": base + "/v1/completions",
                    "tokenizer_backend": "huggingface",
                    "tokenizer": tiny_checkpoints["llama"], "tokenized_requests": True,
                    "max_length": 1024, "num_concurrent": 1, "max_retries": 1},
        tasks=["exactdraft_choices"], task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True, limit=None)
    check_scores(results, served_generator)


def test_no_tokenizer_arguments_use_the_servers_tokenizer(live, served_generator,
                                                          tmp_path) -> None:
    """local-completions given only the model and the url: it detects the server's tokenizer
    endpoints and tokenizes through them, with no tokenizer files and no hub."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    base, _ = live
    write_task(tmp_path)
    model = LocalCompletionsAPI(model=MODEL, base_url=base + "/v1/completions",
                                max_length=1024, num_concurrent=1, max_retries=1)
    assert model.tokenizer_backend == "remote"
    assert model.tok_encode("abc abc") == served_generator.tokenizer.encode(
        "abc abc", add_special_tokens=False)
    results = lm_eval.simple_evaluate(
        model=model, tasks=["exactdraft_choices"],
        task_manager=TaskManager(include_path=str(tmp_path)), log_samples=True, limit=None)
    check_scores(results, served_generator)
