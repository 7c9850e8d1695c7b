"""Constraints on generated text (a JSON schema, a regex, a Lark grammar, a list of choices),
checked at once and compiled to token masks through llguidance.

Invariant: a Constraint is immutable and says only what the text must match; everything a
generation changes lives in its ConstraintMatcher (matcher.py), whose mask is a pure function of
the tokens consumed, so one Constraint serves any number of generations. A constraint is checked
whole when it is built (and again when compiled for a tokenizer): a grammar llguidance refuses,
one that matches nothing, and one on whose first tokens llguidance meets its limits
(tokens.refuse_failing) raise ConstraintError before any pass. The same text builds the same
Constraint, kept (bounded) so it is built once. A grammar that names special tokens declares them
and is checked, and compiled, as special_tokens.py says.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactdraft.constraints.matcher import ConstraintMatcher, apply_mask
from exactdraft.constraints.special_tokens import (
    byte_tokenizer_with,
    checked_names,
    hint_for,
    refuse_token_ids,
    require_special,
)
from exactdraft.constraints.tokens import (
    bridge_for,
    byte_tokenizer,
    compiled_matcher,
    llguidance_module,
    refuse_empty,
    refuse_failing,
    short,
)
from exactdraft.errors import ConstraintError

# ConstraintMatcher and apply_mask are the matcher module's, named here too.
__all__ = ["Constraint", "ConstraintMatcher", "apply_mask", "parse_json"]

# JSON is written compactly with one space after ':' and ',' unless the schema's "x-guidance"
# says otherwise: no free whitespace means more forced bytes and no runs of blank lines.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Constraints kept by their text (a client sending the same schema every turn builds it once).
BUILT_CONSTRAINTS = 128


@dataclass(frozen=True)
class Constraint:
    """What the generated text must match. Immutable and hashable; build it with one of the
    classmethods, which check it at once (ConstraintError naming what is wrong)."""

    kind: str      # "json_schema", "regex", "grammar" or "choices"
    source: str    # the schema (as JSON), pattern, grammar or JSON list of choices
    llguidance_grammar: str = field(repr=False)  # the llguidance grammar built from it
    # The special tokens a grammar names (`<|channel|>`), sorted: a tokenizer must have each
    # as a special token (special_tokens.py).
    special_tokens: tuple[str, ...] = ()

    @classmethod
    def json_schema(cls, schema: dict | str | type, *, compact: bool = True) -> Constraint:
        """Text that parses as JSON and validates against `schema`: a dict, a JSON string, or
        a pydantic model class. compact=False lets the model write free whitespace."""
        if isinstance(schema, type):
            if not hasattr(schema, "model_json_schema"):
                raise ConstraintError(f"json_schema needs a dict, a JSON string or a pydantic "
                                      f"model class, got the class {schema.__name__}")
            schema = schema.model_json_schema()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as error:
                raise ConstraintError(f"json_schema is not valid JSON: {error}") from None
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError(f"json_schema must be a JSON object, got "
                                  f"{type(schema).__name__} {schema!r}")
        try:
            source = json.dumps(schema, ensure_ascii=False)  # key order kept: it is the output's
        except (TypeError, ValueError) as error:
            raise ConstraintError(f"json_schema cannot be written as JSON: {error}") from None
        return _built("json_schema", source, compact)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Text that matches `pattern` as a whole (Rust regex syntax, no look-around)."""
        if not isinstance(pattern, str):
            raise ConstraintError(f"regex must be a string, got {type(pattern).__name__}")
        return _built("regex", pattern)

    @classmethod
    def grammar(cls, lark: str, special_tokens: Sequence[str] = ()) -> Constraint:
        """Text that the Lark-style grammar (llguidance's syntax: `start: ...`, /regex/ and
        "string" terminals, %json {...} for embedded schemas) derives from `start`.

        `special_tokens`: the special (control) tokens the grammar names as tokens, written
        `<|channel|>` in it (a "string" is text, which never produces a special token). The
        grammar is checked against a byte vocabulary that has them, and compiles only for a
        tokenizer that has each as a special token (ConstraintError naming the missing one)."""
        if not isinstance(lark, str) or not lark.strip():
            raise ConstraintError(f"grammar must be a non-empty Lark grammar string, got "
                                  f"{lark!r}")
        names = checked_names(special_tokens)
        refuse_token_ids(lark, "grammar")
        return _built("grammar", lark, True, names)

    @classmethod
    def gbnf(cls, text: str, special_tokens: Sequence[str] = ()) -> Constraint:
        """A grammar in llama.cpp's GBNF (EBNF) syntax, converted to Lark (a grammar already
        in Lark syntax is taken as it is). `special_tokens` as for `grammar`: GBNF has no way
        to write a special token, so only a Lark grammar given here can name them."""
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError(f"gbnf must be a non-empty grammar string, got {text!r}")
        names = checked_names(special_tokens)
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            lark = any_to_lark(text)
        except Exception as error:  # the converter raises plain exceptions of several kinds
            raise ConstraintError(f"invalid GBNF grammar: {error}") from None
        refuse_token_ids(lark, "grammar")
        return _built("grammar", lark, True, names)

    @classmethod
    def choices(cls, options: Sequence[str]) -> Constraint:
        """Text equal to one of `options` (non-empty list of strings)."""
        if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
            raise ConstraintError(f"choices must be a list of strings, got {options!r}")
        if not options:
            raise ConstraintError("choices is empty: at least one option is needed")
        for index, option in enumerate(options):
            if not isinstance(option, str):
                raise ConstraintError(f"choices[{index}] must be a string, got {option!r}")
        return _built("choices", json.dumps(list(options), ensure_ascii=False))

    @classmethod
    def _checked(cls, kind: str, source: str, grammar: str,
                 special_tokens: tuple[str, ...] = ()) -> Constraint:
        """Validate the grammar, and refuse one that matches nothing, on a byte vocabulary
        (with the special tokens the grammar names): what is wrong is said before any model
        or tokenizer is involved."""
        llg = llguidance_module()
        vocabulary = byte_tokenizer_with(special_tokens) if special_tokens else byte_tokenizer()
        failed, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, vocabulary)
        if failed:
            raise ConstraintError(f"invalid {kind} {short(source)}: "
                                  f"{hint_for(messages[0].strip())}")
        probe = llg.LLMatcher(vocabulary, grammar, log_level=0)
        size, eos = vocabulary.vocab_size, vocabulary.eos_token
        refuse_empty(probe, kind, source, size, eos)
        refuse_failing(probe, kind, source, size, eos)
        return cls(kind, source, grammar, special_tokens)

    def compile_for(self, tokenizer: Any) -> None:
        """Compile this constraint for `tokenizer` now (once per tokenizer object; kept for
        the generations that use it) and check it there: ConstraintError if it matches nothing
        with the tokenizer's tokens or llguidance fails on its first tokens (or, for a grammar
        that names special tokens, the tokenizer lacks one of them)."""
        bridge = bridge_for(tokenizer)
        require_special(self.special_tokens, bridge, self.kind)
        compiled_matcher(self, tokenizer, bridge)

    def matcher(self, tokenizer: Any, vocab_size: int,
                stop_token_ids: Sequence[int]) -> ConstraintMatcher:
        """A fresh matcher for one generation, over a model vocabulary of `vocab_size` ids (ids
        past the tokenizer's are never allowed) that ends on any of `stop_token_ids`."""
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
                or vocab_size < 1:
            raise ConstraintError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        stops = tuple(dict.fromkeys(int(t) for t in stop_token_ids))
        for token in stops:
            if not 0 <= token < vocab_size:
                raise ConstraintError(f"stop token id {token} is outside the vocabulary "
                                      f"[0, {vocab_size})")
        bridge = bridge_for(tokenizer)
        require_special(self.special_tokens, bridge, self.kind)
        initial = compiled_matcher(self, tokenizer, bridge)
        return ConstraintMatcher(self, bridge, initial.deep_copy(), int(vocab_size), stops)


@functools.lru_cache(maxsize=BUILT_CONSTRAINTS)
def _built(kind: str, source: str, compact: bool = True,
           special_tokens: tuple[str, ...] = ()) -> Constraint:
    """The Constraint of `kind` from its text, built and checked once per text (a constraint
    is immutable, so the same text gives the same one); the last BUILT_CONSTRAINTS are kept.
    Refusals are not kept: each is raised anew."""
    llg = llguidance_module().LLMatcher
    if kind == "json_schema":
        try:
            grammar = llg.grammar_from_json_schema(source,
                                                   defaults=COMPACT_JSON if compact else None)
        except ValueError as error:
            raise ConstraintError(f"invalid json_schema: {error}") from None
    elif kind == "regex":
        grammar = llg.grammar_from_regex(source)
    elif kind == "choices":  # JSON string literals are Lark string literals (escapes included)
        grammar = llg.grammar_from_lark("start: " + " | ".join(
            json.dumps(option) for option in json.loads(source)))
    else:
        grammar = llg.grammar_from_lark(source)
    return Constraint._checked(kind, source, grammar, special_tokens)


def parse_json(text: str) -> Any:
    """The JSON value of a JSON-constrained generation's text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConstraintError(f"the generated text is not complete JSON ({error.msg} at "
                              f"character {error.pos}): {short(text)}") from None
