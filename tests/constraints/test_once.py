"""Values kept once per object (exactdraft/constraints/once.py), and a bridge's special-token
names kept with it: found on first use only, separately for each object; an object that cannot
be weakly referenced is answered afresh each time (the control)."""

from __future__ import annotations

import gc

import pytest

from exactdraft.constraints.once import OncePer, once_per

pytest.importorskip("llguidance")


class Owner:
    pass


def test_a_value_is_made_once_per_owner():
    table, made = OncePer(), []

    def make(name):
        made.append(name)
        return False  # a false value is kept like any other

    first, second = Owner(), Owner()
    assert [once_per(first, table, lambda: make("first")) for _ in range(3)] == [False] * 3
    assert once_per(second, table, lambda: make("second")) is False
    assert made == ["first", "second"]
    del first
    gc.collect()
    assert len(table.values) == 1  # kept only while the owner lives
    # The control: an owner that cannot be weakly referenced gets a fresh value each time.
    assert [once_per(7, table, lambda: make("int")) for _ in range(2)] == [False, False]
    assert made == ["first", "second", "int", "int"]


class CountedBridge:
    """A bridge whose special ids count how often they are read."""

    def __init__(self) -> None:
        self.tokens = [b"a", b"<|x|>", b"<|y|>"]
        self.reads = 0

    @property
    def special_token_ids(self):
        self.reads += 1
        return [1, 2]


def test_special_names_and_require_special_read_a_bridge_once():
    from exactdraft.constraints.special_tokens import require_special, special_names
    from exactdraft.errors import ConstraintError

    bridge = CountedBridge()
    for _ in range(3):
        assert special_names(bridge) == {"<|x|>", "<|y|>"}
        require_special(["<|x|>", "<|y|>"], bridge, "grammar")
    with pytest.raises(ConstraintError, match="<\\|z\\|>"):
        require_special(["<|x|>", "<|z|>"], bridge, "grammar")
    assert bridge.reads == 1
    other = CountedBridge()  # another bridge: its own names
    special_names(other)
    assert other.reads == 1
