"""The drafter registry: every spec the table names parses and builds the drafter it names, every
other spec is refused naming the bad part, and the command line's help, checks and drafter all
come from the one table (a new row shows up everywhere with no other edit)."""

from __future__ import annotations

import pytest

import exactdraft as xd
from exactdraft.cli import build_parser, main
from exactdraft.drafters import registry
from exactdraft.errors import ParameterError


def test_every_row_is_spelled_in_the_usage_and_the_help():
    assert registry.spellings() == ["lookup", "suffix", "head", "head:PATH", "model:PATH"]
    usage = registry.usage()
    help_text = registry.help_text("lookup")
    for spelled in registry.spellings():
        assert spelled in usage and spelled in help_text
    assert "(default: lookup)" in help_text and "+" in help_text and "none" in help_text


@pytest.mark.parametrize("spec,names", [
    ("lookup", ["lookup"]), ("suffix", ["suffix"]), ("head", ["head"]),
    ("lookup+suffix", ["lookup", "suffix"]), ("suffix+lookup+head", ["suffix", "lookup", "head"]),
    ("model:/some/model", ["model"]), ("none", []),
])
def test_specs_parse_to_their_rows(spec, names):
    assert [part.kind.name for part in registry.parse(spec)] == names


@pytest.mark.parametrize("spec,needle", [
    ("magic", "unknown drafter 'magic'"),
    ("lookup+magic", "unknown drafter 'magic'"),
    ("lookup+none", "unknown drafter 'none'"),
    ("model", "unknown drafter 'model'"),  # model needs its PATH
    ("lookup:5", "unknown drafter 'lookup:5'"),  # lookup takes none
    ("", "unknown drafter ''"),
    ("lookup+", "unknown drafter ''"),
    ("model:", "model:PATH needs the draft model's path"),
    ("head:", "head:PATH needs the head's folder"),
    ("head:/no/such/head", "head:/no/such/head: no folder there"),
    (3, "a drafter spec must be a string"),
])
def test_bad_specs_are_named(spec, needle):
    with pytest.raises(ParameterError) as raised:
        registry.parse(spec)
    assert needle in str(raised.value)


def test_build_makes_what_the_spec_names(tiny_checkpoints):
    lookup = registry.build("lookup")
    assert isinstance(lookup, xd.PromptLookup) and lookup.max_draft == 8
    suffix = registry.build("suffix", max_draft=3)
    assert isinstance(suffix, xd.SuffixDrafter) and suffix.max_draft == 3
    assert registry.build("none") is None
    model = registry.build(f"model:{tiny_checkpoints['llama']}", load_options={"backend": "torch"})
    assert isinstance(model, xd.DraftModel) and model.max_draft == 4
    chain = registry.build("suffix+lookup", max_draft=5)
    assert not isinstance(chain, xd.FallbackDrafter) and callable(chain)  # built on the target
    fallback = chain(object())
    assert isinstance(fallback, xd.FallbackDrafter)
    assert [type(d) for d in fallback.drafters] == [xd.SuffixDrafter, xd.PromptLookup]
    assert [d.max_draft for d in fallback.drafters] == [5, 5]


def test_a_head_spec_loads_its_folder_on_the_target(tmp_path, monkeypatch):
    calls, head = [], xd.SuffixDrafter()  # stands in for the loaded head
    monkeypatch.setattr(xd.DraftHead, "from_pretrained",
                        classmethod(lambda cls, path, target, max_draft: calls.append(
                            (path, target, max_draft)) or head))
    target = object()
    assert registry.build("head")(target) is head
    assert registry.build(f"head:{tmp_path}", max_draft=2)(target) is head
    chain = registry.build(f"lookup+head:{tmp_path}")(target)
    assert isinstance(chain.drafters[0], xd.PromptLookup) and chain.drafters[1] is head
    assert calls == [(None, target, 4), (str(tmp_path), target, 2), (str(tmp_path), target, 4)]


def test_a_new_row_reaches_the_cli_with_no_other_edit(monkeypatch, capsys):
    built = []

    class Echo:
        max_draft = 1
        begin = propose = accepted = None

    row = registry.DrafterKind("echo", "repeats the last token",
                               lambda path, depth, options: built.append(depth) or Echo(), 1)
    monkeypatch.setattr(registry, "DRAFTERS", registry.DRAFTERS + (row,))
    help_text = next(a.help for a in build_parser()._subparsers._group_actions[0]
                     .choices["generate"]._actions if a.dest == "drafter")
    assert "echo (repeats the last token)" in help_text
    assert isinstance(registry.build("lookup+echo")(object()).drafters[1], Echo)
    assert built == [1]

    def refuse(*args, **kwargs):
        raise AssertionError("loaded")

    monkeypatch.setattr(xd.Generator, "from_pretrained", refuse)
    assert main(["generate", "--chat", "x", "--drafter", "echo:3"]) == 2
    assert "use lookup, suffix, head, head:PATH, model:PATH, echo," in capsys.readouterr().err


def test_a_drafters_declarations_are_read_in_one_place_with_their_defaults():
    """traits_of gives DrafterTraits' defaults for a drafter that declares nothing (or a value
    of the wrong kind, which can cost only speed) and the declared values otherwise; a
    FallbackDrafter declares what its drafters together need."""
    from exactdraft.drafters import DrafterTraits, FallbackDrafter, traits_of

    class Bare:
        max_draft = 2

        def begin(self, prompt, context): ...

        def propose(self, sequence, limit): return []

        def accepted(self, proposed, accepted): ...

    assert traits_of(Bare()) == DrafterTraits()
    odd = Bare()
    odd.tree_width, odd.wants_features, odd.sources, odd.vocab_size = True, "yes", 0, 1.5
    assert traits_of(odd) == DrafterTraits()  # no source(): sources stays 1 regardless
    declared = Bare()
    declared.tree_width, declared.wants_features, declared.vocab_size = 3, True, 128
    declared.copies_per_sequence = True
    assert traits_of(declared) == DrafterTraits(tree_width=3, wants_features=True,
                                                vocab_size=128, copies_per_sequence=True)
    both = FallbackDrafter(declared, Bare())
    assert traits_of(both) == DrafterTraits(tree_width=3, wants_features=True, sources=2,
                                            vocab_size=128, copies_per_sequence=False)
