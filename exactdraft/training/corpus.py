"""Self-distillation data for a draft head: text the target writes itself, its features, and
the draft vocabulary.

Invariant: the corpus is a pure function of (the target's weights, the prompts, the generation
settings, the seed): every reply is the target's exact keyed sampling (the engine's outputs
equal serial runs), and the features are the target's own final hidden rows of each sequence
(row invariant, so the same bits however the passes are cut). A corpus file records the
target's weights digest and its settings and is reused only when both match.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.errors import ParameterError
from exactdraft.sampling.params import SamplingParams

PROMPTS_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "data", "train_prompts.txt")
CORPUS_FILE = "corpus.json"


@dataclass
class Example:
    tokens: list[int]  # prompt then reply
    n_prompt: int


def read_prompts(path: str | None = None) -> list[str]:
    """One prompt per line (\\n in a line is a newline); default: the package's set."""
    path = PROMPTS_FILE if path is None else path
    try:
        with open(path, encoding="utf-8") as handle:
            prompts = [line.rstrip("\n").replace("\\n", "\n") for line in handle if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise ParameterError(f"prompts file {path}: cannot be read ({error})") from None
    if not prompts:
        raise ParameterError(f"prompts file {path}: no prompts")
    return prompts


def sample_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index * 7_919 + 1) % (2**63)


def generate_corpus(generator: Any, prompts: Sequence[str], settings: dict[str, Any],
                    report: Callable[[str], None]) -> list[Example]:
    """The target's replies: `samples` per prompt, reply k (prompt i, sample j) at temperature
    temperatures[k % len] with seed sample_seed(seed, k), k = i * samples + j, the prompt
    rendered with the chat template when the tokenizer has one."""
    from exactdraft.engine import Engine

    tokenizer = generator.tokenizer
    chat = tokenizer is not None and getattr(tokenizer, "chat_template", None) is not None
    temperatures, samples = settings["temperatures"], settings["samples"]
    started, examples, written = time.monotonic(), [], 0
    with Engine(generator, max_sequences=settings["generation_batch"],
                max_waiting=len(prompts) * samples + 1) as engine:
        submissions = []
        for index in range(len(prompts) * samples):
            text = prompts[index // samples]
            prompt = [{"role": "user", "content": text}] if chat else text
            params = SamplingParams(temperature=temperatures[index % len(temperatures)],
                                    seed=sample_seed(settings["seed"], index))
            submissions.append(engine.submit(prompt, max_new_tokens=settings["max_new_tokens"],
                                             sampling=params))
        for index, submission in enumerate(submissions):
            result = submission.results()[0]
            examples.append(Example(list(result.prompt_tokens) + list(result.tokens),
                                    len(result.prompt_tokens)))
            written += len(result.tokens)
            elapsed = time.monotonic() - started
            eta = elapsed / (index + 1) * (len(submissions) - index - 1)
            report(f"writing the corpus: {index + 1}/{len(submissions)} replies, {written} "
                   "tokens", elapsed, eta)
    return examples


def load_or_generate(folder: str, generator: Any, prompts: Sequence[str],
                     settings: dict[str, Any], report: Callable[..., None]) -> list[Example]:
    """The corpus in `folder` if it was written for this target and these settings, else a
    new one (then saved there)."""
    path = os.path.join(folder, CORPUS_FILE)
    identity = json.loads(json.dumps({  # as the file holds it (tuples become lists)
        "target_digest": generator.target.weights_digest(), "prompts": list(prompts),
        **{k: settings[k] for k in ("seed", "temperatures", "max_new_tokens", "samples")}}))
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            stored = json.load(handle)
        if stored.get("identity") == identity:
            return [Example(e["tokens"], e["n_prompt"]) for e in stored["examples"]]
    examples = generate_corpus(generator, prompts, settings, report)
    temporary = path + ".partial"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump({"identity": identity, "examples": [e.__dict__ for e in examples]}, handle)
    os.replace(temporary, path)
    return examples


def target_features(target: Any, tokens: Sequence[int], chunk: int = 512) -> np.ndarray:
    """The target's features [len(tokens), hidden] of a sequence (one fresh state)."""
    state = target.new_state()
    rows = []
    for begin in range(0, len(tokens), chunk):
        _, features = target.forward(state, list(tokens[begin:begin + chunk]), rows="last",
                                     features=True)
        rows.append(np.asarray(features, dtype=np.float32))
    return np.concatenate(rows)


def draft_vocabulary(examples: Sequence[Example], vocab_size: int, size: int) -> np.ndarray:
    """The `size` tokens most frequent in the replies (ties: the lower id), ascending."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for example in examples:
        np.add.at(counts, np.asarray(example.tokens[example.n_prompt:], dtype=np.int64), 1)
    order = np.lexsort((np.arange(vocab_size), -counts))  # count descending, then id
    return np.sort(order[:min(size, vocab_size)]).astype(np.int64)
