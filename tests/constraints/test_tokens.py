"""Forced text equal to a special token's text (exactdraft/constraints/tokens.py): a JSON const,
a grammar string, a regex or a choice that reads `<|channel|>` is forced and generated as
ordinary text tokens, never as the special token, on a tiny tokenizer that has it as special and
on SmolLM2's byte-level BPE (`<|im_end|>`); where the encoder cannot be copied, the greedy split
over ordinary tokens answers, and the copy is not tried again; threads that meet at the first
use make one copy. Negative control: the encoder alone (which reads the text as the special
token) gets the same constraints refused, as they were before."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np
import pytest

from exactdraft.constraints import tokens
from exactdraft.errors import ConstraintError
from tests.constraints import test_constraint
from tests.constraints.test_special_tokens import tiny_tokenizer

pytest.importorskip("llguidance")

from exactdraft.constraints import Constraint  # noqa: E402

smollm2_tokenizer = test_constraint.smollm2_tokenizer  # SmolLM2's tokenizer, or a skip

CHANNEL = "<|channel|>"
# (constraint, the whole text it allows); each forces the marker's bytes somewhere.
CASES = [
    (lambda: Constraint.json_schema({"const": CHANNEL}), f'"{CHANNEL}"'),
    (lambda: Constraint.json_schema({"type": "object", "properties": {"end": {"const": CHANNEL}},
                                     "required": ["end"], "additionalProperties": False}),
     f'{{"end": "{CHANNEL}"}}'),
    (lambda: Constraint.grammar(f'start: "go{CHANNEL}x"'), f"go{CHANNEL}x"),
    (lambda: Constraint.regex(r"<\|channel\|>"), CHANNEL),
    (lambda: Constraint.choices([CHANNEL]), CHANNEL),
]


def generated(constraint: Constraint, tokenizer) -> list[int]:
    """The tokens of a walk that takes every forced run and else the lowest allowed id, to
    the end of the constraint."""
    matcher = constraint.matcher(tokenizer, tokenizer.vocab_size, tokenizer.stop_token_ids)
    for _ in range(64):
        if matcher.complete:
            break
        forced = matcher.forced()
        for token in forced or [int(np.flatnonzero(matcher.allowed())[0])]:
            matcher.consume(token)
    assert matcher.complete
    return list(matcher.tokens)


def special_ids(tokenizer) -> set[int]:
    return {i for i, token in tokenizer.backend.get_added_tokens_decoder().items()
            if token.special}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_forced_special_token_text_is_written_as_text(case):
    tokenizer = tiny_tokenizer()
    build, text = CASES[case]
    assert tokenizer.encode(CHANNEL) == [tokenizer.backend.token_to_id(CHANNEL)]  # the premise
    ids = generated(build(), tokenizer)
    assert tokenizer.decode(ids) == text
    assert not set(ids) & special_ids(tokenizer)
    assert ids == [tokenizer.backend.token_to_id(c) for c in text]  # one character each


@pytest.mark.parametrize("case", range(len(CASES)))
def test_negative_control_the_encoder_alone_gets_them_refused(case, monkeypatch):
    def encoder_only(table, text):
        return list(table._backend.encode(text, add_special_tokens=False).ids)

    monkeypatch.setattr(tokens._TokenTable, "_encode", encoder_only)
    tokenizer = tiny_tokenizer()  # a fresh object: its own bridge and compiled matchers
    with pytest.raises(ConstraintError, match="beyond what llguidance can follow"):
        CASES[case][0]().compile_for(tokenizer)


def test_without_a_copy_of_the_encoder_the_greedy_split_answers():
    """A stand-in encoder that reads the marker as its special id and cannot be copied."""
    pieces = [b"<", b"|", b"<|", b"|>", b"channel", b"<|channel|>", b"</s>"]

    class Encoder:
        def encode(self, text, add_special_tokens=False):
            class Encoding:
                ids = [5] if text == "<|channel|>" else []
            return Encoding()

    table = tokens._TokenTable(Encoder(), pieces, [5, 6], 6, None)
    assert table("<|channel|>") == [2, 4, 3]  # longest first over the ordinary pieces
    assert table._text_encoder is None


def test_smollm2_writes_an_im_end_const_as_text(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    im_end = tokenizer.backend.token_to_id("<|im_end|>")
    assert im_end in special_ids(tokenizer)
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [im_end]  # the premise
    schema = {"type": "object", "properties": {"end": {"const": "<|im_end|>"}},
              "required": ["end"], "additionalProperties": False}
    ids = generated(Constraint.json_schema(schema), tokenizer)
    assert tokenizer.decode(ids) == '{"end": "<|im_end|>"}'
    assert not set(ids) & special_ids(tokenizer)


class CountedEncoder:
    """An encoder that reads the marker as its special id and counts the copies asked of it
    (to_str), each slow enough for concurrent callers to meet; `copyable`: whether to_str
    works."""

    def __init__(self, copyable: bool, inner=None) -> None:
        self.copyable, self.inner, self.copies = copyable, inner, 0
        self.lock = threading.Lock()

    def encode(self, text, add_special_tokens=False):
        if self.inner is not None:
            return self.inner.encode(text, add_special_tokens=add_special_tokens)

        class Encoding:
            ids = [5] * text.count(CHANNEL)
        return Encoding()

    def to_str(self) -> str:
        with self.lock:
            self.copies += 1
        time.sleep(0.05)
        if not self.copyable:
            raise RuntimeError("no copy")
        return self.inner.to_str()


def test_a_failed_copy_is_not_tried_again():
    pieces = [b"<", b"|", b"<|", b"|>", b"channel", CHANNEL.encode(), b"</s>"]
    encoder = CountedEncoder(copyable=False)
    table = tokens._TokenTable(encoder, pieces, [5, 6], 6, None)
    # Texts the table has not seen (it keeps the ids of those it has), each holding the marker.
    for repeat in range(1, 4):
        assert table(CHANNEL * repeat) == [2, 4, 3] * repeat  # the greedy split answers
    assert encoder.copies == 1


def test_concurrent_first_uses_make_one_copy():
    backend = tiny_tokenizer().backend
    encoder = CountedEncoder(copyable=True, inner=backend)
    table_pieces, special = tokens.token_bytes(tiny_tokenizer())
    table = tokens._TokenTable(encoder, table_pieces, special, backend.token_to_id(CHANNEL),
                               None)
    expected = [backend.token_to_id(c) for c in "x" + CHANNEL]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: table("x" + CHANNEL), range(8)))
    assert answers == [expected] * 8 and encoder.copies == 1
