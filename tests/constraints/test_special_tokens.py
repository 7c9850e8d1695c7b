"""Grammars that name special tokens (exactdraft/constraints/special_tokens.py): where the
grammar names a special token, the mask allows that token's id and nothing else, while the
same marker written as text allows only the text's first character (the special id masked)
and is forced in characters;
a declared name is checked without a tokenizer, an undeclared one is refused with the hint to
declare it, a grammar that refers to a token by id (`<[1]>`) is refused naming the reference
(the same characters in a string literal are text), and a tokenizer that lacks the token (or
has it only as ordinary text) is refused naming it."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.errors import ConstraintError
from exactdraft.loading.tokenizer import Tokenizer

pytest.importorskip("llguidance")

from exactdraft.constraints import Constraint  # noqa: E402
from exactdraft.constraints.special_tokens import token_id_references  # noqa: E402
from tests.constraints import test_constraint  # noqa: E402

smollm2_tokenizer = test_constraint.smollm2_tokenizer  # SmolLM2's tokenizer, or a skip
MARKERS = ["<|channel|>", "<|message|>", "<|return|>"]


def tiny_tokenizer(special: bool = True) -> Tokenizer:
    """One token a printable character, then the markers: added special tokens (as
    o200k_harmony has them), or ordinary added tokens with special=False."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    pieces = [chr(c) for c in range(32, 127)] + MARKERS
    backend = Backend(models.WordLevel({p: i for i, p in enumerate(pieces)}, " "))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    backend.decoder = decoders.Fuse()
    backend.add_tokens([AddedToken(m, special=special) for m in MARKERS])
    return Tokenizer(backend, eos_token_id=backend.token_to_id("<|return|>"))


def matcher_after(constraint: Constraint, tokenizer: Tokenizer, text: str):
    matcher = constraint.matcher(tokenizer, tokenizer.vocab_size, tokenizer.stop_token_ids)
    for token in tokenizer.encode(text):
        matcher.consume(token)
    return matcher


def test_a_named_special_token_is_the_only_token_allowed_there():
    tokenizer = tiny_tokenizer()
    channel = tokenizer.backend.token_to_id("<|channel|>")
    lark = 'start: "go" <|channel|> "x" /[a-z]+/'
    constraint = Constraint.grammar(lark, special_tokens=["<|channel|>"])
    assert constraint.special_tokens == ("<|channel|>",)
    matcher = matcher_after(constraint, tokenizer, "go")
    assert np.flatnonzero(matcher.allowed()).tolist() == [channel]
    assert matcher.only_allowed() == channel
    matcher.consume(channel)
    assert np.flatnonzero(matcher.allowed()).tolist() == tokenizer.encode("x")
    assert tokenizer.decode(matcher.tokens) == "go<|channel|>"  # the text the readers see
    # Negative control: the marker written as text allows its first character, never the id.
    text = matcher_after(Constraint.grammar('start: "go" ("<|channel|>x" | "<b") /[a-z]+/'),
                         tokenizer, "go")
    assert np.flatnonzero(text.allowed()).tolist() == tokenizer.encode("<")
    assert text.valid_prefix([channel]) == 0
    with pytest.raises(ConstraintError, match="not allowed"):
        text.consume(channel)
    # Where the whole marker is forced as text, it is forced in characters, never as the id.
    forced = matcher_after(Constraint.grammar('start: "go<|channel|>x" /[a-z]+/'), tokenizer,
                           "go").forced()
    assert forced == [tokenizer.backend.token_to_id(c) for c in "<|channel|>x"]


def test_forced_special_tokens_are_proposed_as_drafts():
    tokenizer = tiny_tokenizer()
    named = Constraint.grammar('start: "go" <|channel|> "xy" <|message|> /[a-z]+/',
                               special_tokens=["<|channel|>", "<|message|>"])
    forced = matcher_after(named, tokenizer, "g").forced()
    assert forced == tokenizer.encode("o<|channel|>xy<|message|>") and len(forced) == 5


def test_a_special_token_ends_free_text_and_a_stop_token_ends_the_grammar():
    """A regex of free text followed by a named token: the token ends it (its text is never
    the regex's), and the eos that is also a stop token is allowed where the grammar ends."""
    tokenizer = tiny_tokenizer()
    message, stop = (tokenizer.backend.token_to_id(m) for m in ("<|message|>", "<|return|>"))
    constraint = Constraint.grammar('start: /[a-z <|]*/ <|message|> "ok"',
                                    special_tokens=["<|message|>"])
    matcher = matcher_after(constraint, tokenizer, "hi <there|")
    allowed = set(np.flatnonzero(matcher.allowed()).tolist())
    assert message in allowed and tokenizer.encode("<")[0] in allowed and stop not in allowed
    matcher.consume(message)
    for token in tokenizer.encode("ok"):
        matcher.consume(token)
    assert matcher.complete and np.flatnonzero(matcher.allowed()).tolist() == [stop]


def test_declared_names_are_checked_without_a_tokenizer():
    with pytest.raises(ConstraintError, match=r"special_tokens=\[\.\.\.\]"):
        Constraint.grammar('start: "a" <|channel|>')  # named, not declared
    with pytest.raises(ConstraintError, match="unknown special token.*<\\|message\\|>"):
        Constraint.grammar('start: "a" <|message|>', special_tokens=["<|channel|>"])
    for bad in ("channel", "<|a b|>", 7, "<|channel|>"[0]):
        with pytest.raises(ConstraintError, match="special_tokens\\[0\\]"):
            Constraint.grammar('start: "a"', special_tokens=[bad])
    with pytest.raises(ConstraintError, match="list of token names"):
        Constraint.grammar('start: "a"', special_tokens="<|channel|>")
    # The control: declared, the same grammar builds, and equal text builds an equal value.
    assert Constraint.grammar('start: "a" <|channel|>', special_tokens=("<|channel|>",)) == \
        Constraint.grammar('start: "a" <|channel|>', special_tokens=["<|channel|>"])


def test_a_tokenizer_without_the_special_token_is_refused_naming_it():
    constraint = Constraint.grammar('start: "a" <|channel|>', special_tokens=["<|channel|>"])
    plain = tiny_tokenizer(special=False)  # <|channel|> is an ordinary token there
    for call in (lambda: constraint.compile_for(plain),
                 lambda: constraint.matcher(plain, plain.vocab_size, [0])):
        with pytest.raises(ConstraintError, match="<\\|channel\\|>, which this tokenizer"):
            call()
    constraint.compile_for(tiny_tokenizer())  # the control: compiles where it is special


def test_the_declared_tokens_are_part_of_what_a_constraint_is_kept_by():
    """The same grammar text with and without declared tokens: two constraints, neither
    answered from the other's kept build."""
    named = 'start: "a" <|channel|>'
    Constraint.grammar(named, special_tokens=["<|channel|>"])
    with pytest.raises(ConstraintError, match="unknown special token"):
        Constraint.grammar(named)  # built after the declared one, still refused
    plain = 'start: "a" /[a-z]/'
    declared = Constraint.grammar(plain, special_tokens=["<|message|>"])
    undeclared = Constraint.grammar(plain)
    assert declared != undeclared and undeclared.special_tokens == ()
    lacking = tiny_tokenizer(special=False)
    undeclared.compile_for(lacking)  # the control: nothing declared, nothing required
    with pytest.raises(ConstraintError, match="<\\|message\\|>, which this tokenizer"):
        declared.compile_for(lacking)


def test_gbnf_takes_declared_special_tokens():
    """GBNF has no syntax for a special token; a Lark grammar given as gbnf can name them."""
    tokenizer = tiny_tokenizer()
    channel = tokenizer.backend.token_to_id("<|channel|>")
    lark = Constraint.gbnf('start: "go" <|channel|> /[a-z]+/', special_tokens=["<|channel|>"])
    assert lark == Constraint.grammar('start: "go" <|channel|> /[a-z]+/',
                                      special_tokens=["<|channel|>"])
    assert matcher_after(lark, tokenizer, "go").only_allowed() == channel
    gbnf = Constraint.gbnf('root ::= "go" [a-z]+', special_tokens=["<|channel|>"])
    assert gbnf.special_tokens == ("<|channel|>",) and Constraint.gbnf(
        'root ::= "go" [a-z]+').special_tokens == ()
    with pytest.raises(ConstraintError, match="special_tokens=\\[\\.\\.\\.\\]"):
        Constraint.gbnf('start: "go" <|channel|> /[a-z]+/')  # named, not declared
    with pytest.raises(ConstraintError, match="special_tokens\\[1\\]"):
        Constraint.gbnf('root ::= "go"', special_tokens=["<|channel|>", "channel"])


@pytest.mark.parametrize("lark, references", [
    ('start: "a" <[96]> "b"', ["<[96]>"]),
    ('start: "a" (<[1-5]> | <[7]>)', ["<[1-5]>", "<[7]>"]),
    ('start: x <[2]>\nx: "<[1]>" /<[3]>/ // <[4]>', ["<[2]>"]),
    ('start: "a\\"<[1]>" <[5]>', ["<[5]>"]),  # an escaped quote stays in the string
    ('start: "a<[1]>" /[a-z]<[2]>/ // <[3]>\n', []),
])
def test_token_id_references_outside_literals_and_comments(lark, references):
    assert token_id_references(lark) == references


def test_a_grammar_that_forces_a_token_by_id_is_refused():
    tokenizer = tiny_tokenizer()
    message = tokenizer.backend.token_to_id("<|message|>")
    for build in (Constraint.grammar, Constraint.gbnf):
        for lark in (f'start: "a" <[{message}]> "b"', 'start: "a" <[1]>\nb: <[0-3]>'):
            with pytest.raises(ConstraintError, match=r"refers to tokens by id \(<\[") as refused:
                build(lark)
            assert "special_tokens=[...]" in str(refused.value)
            assert all(ref in str(refused.value) for ref in token_id_references(lark))
        # Declared tokens do not make an id reference acceptable.
        with pytest.raises(ConstraintError, match="refers to tokens by id"):
            build('start: "a" <|channel|> <[1]>', special_tokens=["<|channel|>"])
    # The control: the same characters in a string literal are text, and force text.
    text = Constraint.grammar(f'start: "a<[{message}]>b"')
    assert text.special_tokens == ()
    matcher = matcher_after(text, tokenizer, "a")
    assert np.flatnonzero(matcher.allowed()).tolist() == tokenizer.encode("<")
    assert Constraint.gbnf('root ::= "a<[1]>"').kind == "grammar"


def test_a_grammar_naming_a_token_by_id_is_refused_on_smollm2(smollm2_tokenizer):
    with pytest.raises(ConstraintError, match=r"<\[1\]>"):
        Constraint.grammar('start: "a" <[1]> "b"')
    # The control: declared by name, SmolLM2's <|im_start|> (id 1) is allowed.
    named = Constraint.grammar('start: "a" <|im_start|> "b"', special_tokens=["<|im_start|>"])
    matcher = named.matcher(smollm2_tokenizer, smollm2_tokenizer.vocab_size,
                            smollm2_tokenizer.stop_token_ids)
    for token in smollm2_tokenizer.encode("a"):
        matcher.consume(token)
    assert matcher.only_allowed() == 1


def test_a_stop_token_the_grammar_requires_leaves_nothing_allowed_there():
    """As the guide says: a stop token a grammar requires (in the middle or at the end)
    builds and compiles, and the mask there is empty (the generation ends unsatisfiable);
    named as optional at the end (the control), the stop token is allowed and ends the text."""
    tokenizer = tiny_tokenizer()
    stop = tokenizer.backend.token_to_id("<|return|>")
    assert stop in tokenizer.stop_token_ids
    for lark in ('start: "a" <|return|> "b"', 'start: "a" <|return|>'):
        required = Constraint.grammar(lark, special_tokens=["<|return|>"])
        required.compile_for(tokenizer)
        assert not matcher_after(required, tokenizer, "a").allowed().any()
    optional = matcher_after(Constraint.grammar('start: "a" <|return|>?', special_tokens=[
        "<|return|>"]), tokenizer, "a")
    assert stop in np.flatnonzero(optional.allowed()).tolist()
    optional.consume(stop)
    assert optional.complete


def test_the_declared_tokens_in_any_order_build_one_constraint():
    lark = 'start: <|message|> "a" <|channel|>'
    given = Constraint.grammar(lark, special_tokens=["<|message|>", "<|channel|>"])
    assert given.special_tokens == ("<|channel|>", "<|message|>")  # sorted, once each
    for other in (["<|channel|>", "<|message|>"], ["<|message|>", "<|channel|>", "<|message|>"]):
        assert Constraint.grammar(lark, special_tokens=other) is given  # the one kept build
    # A name that is not a token is still refused by its index as given.
    with pytest.raises(ConstraintError, match="special_tokens\\[2\\]"):
        Constraint.grammar(lark, special_tokens=["<|message|>", "<|channel|>", "x"])
    # The control: another set of tokens is another constraint.
    assert Constraint.grammar(lark, special_tokens=["<|message|>", "<|channel|>",
                                                    "<|return|>"]) != given

