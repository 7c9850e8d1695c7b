"""Values computed once per object (a tokenizer, its bridge) and kept while the object lives.

Invariant: `once_per(owner, table, make)` returns the value kept for `owner` in `table`, made
by `make()` the first time it is asked for; threads that ask at once may each make one, and
all get the one kept first. An owner that cannot be weakly referenced gets `make()` each time.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

Value = TypeVar("Value")


class OncePer:
    """A table of kept values, one per live owner, with its lock."""

    def __init__(self) -> None:
        self.values: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()


def once_per(owner: Any, table: OncePer, make: Callable[[], Value]) -> Value:
    """The value `table` keeps for `owner`, made by `make()` the first time."""
    try:
        with table.lock:
            value = table.values.get(owner)
    except TypeError:  # not weakly referable: nothing can be kept for it
        return make()
    if value is None:
        value = make()
        with table.lock:
            value = table.values.setdefault(owner, value)
    return value
