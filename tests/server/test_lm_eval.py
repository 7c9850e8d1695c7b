"""lm-evaluation-harness itself (its `local-completions` model, pinned in the test extra)
running a multiple-choice loglikelihood task on data this test writes, against a live server:
every choice's loglikelihood is the sum of exactdraft.scoring's logprobs of its tokens, and
the greedy flag says whether each was the most probable token. Slow job: lm-eval builds a
dataset and a task on the way."""

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


def test_a_multiple_choice_task_scores_exactly(live, served_generator, tiny_checkpoints,
                                               tmp_path) -> None:
    from lm_eval.tasks import TaskManager

    base, _ = live
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    (tmp_path / "task.yaml").write_text(
        "task: exactdraft_choices\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": MODEL, "base_url": base + "/v1/completions",
                    "tokenizer_backend": "huggingface",
                    "tokenizer": tiny_checkpoints["llama"], "tokenized_requests": True,
                    "max_length": 1024, "num_concurrent": 1, "max_retries": 1},
        tasks=["exactdraft_choices"], task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True, limit=None)
    samples = results["samples"]["exactdraft_choices"]
    assert len(samples) == len(QUESTIONS)
    tokenizer = served_generator.tokenizer
    for sample in samples:
        question = QUESTIONS[sample["doc_id"]]
        context = tokenizer.encode(question["question"])
        for choice, response in zip(question["choices"], sample["resps"]):
            whole = tokenizer.encode(question["question"] + " " + choice)
            assert whole[:len(context)] == context
            scored = score(served_generator, context, whole[len(context):], temperature=0,
                           top=1)
            loglikelihood, greedy = response[0]
            assert loglikelihood == sum(e.logprob for e in scored)
            assert greedy == all(e.top[0][0] == e.token for e in scored)
    assert 0 <= results["results"]["exactdraft_choices"]["acc,none"] <= 1
