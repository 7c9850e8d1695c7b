"""A one-line progress display for long work (loading, the load-time guard, checks, recordings).

Invariant: progress goes to stderr only, and only when stderr is a terminal (or when the caller
asks for it explicitly); it never writes to stdout, never to a log or a pipe unasked, and it
erases its line when the work ends, so output and error messages read as if it were not there.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

_REDRAW_EVERY = 0.1  # seconds between redraws of a counter


def enabled_for(stream: Any, progress: bool | None) -> bool:
    """`progress` as given, or (None) whether `stream` is a terminal."""
    if progress is not None:
        return bool(progress)
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


class Progress:
    """`with Progress("loading") as bar: bar.phase("reading"); bar.count(3, 10, "cases")`.

    `progress=None` shows it when stderr is a terminal, True always, False never."""

    def __init__(self, label: str, progress: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled_for(self.stream, progress)
        self.label = label
        self.started = time.monotonic()
        self._shown = False
        self._last_draw = 0.0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.clear()

    def phase(self, text: str) -> None:
        """Show what is being done now."""
        self._draw(text, force=True)

    def count(self, done: int, total: int | None, unit: str = "") -> None:
        """Show `done` of `total` (redrawn at most every 0.1 s, and always at the end)."""
        amount = f"{done}/{total}" if total else f"{done}"
        self._draw(f"{amount} {unit}".rstrip(), force=total is not None and done >= total)

    def clear(self) -> None:
        """Erase the line, if anything was shown."""
        if self._shown:
            self._write("\r\x1b[K")
            self._shown = False

    def _draw(self, text: str, force: bool) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < _REDRAW_EVERY:
            return
        self._last_draw = now
        line = f"exactdraft: {self.label}: {text} ({now - self.started:.0f} s)"
        self._write("\r" + line[:119] + "\x1b[K")
        self._shown = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: progress is not worth an error
            self.enabled = False
