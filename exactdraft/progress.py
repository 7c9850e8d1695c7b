"""Progress for long work (loading, the load-time guard, checks, recordings), through tqdm.

Invariant: progress never writes to stdout and never changes what the work computes. By
default (`progress=None`) tqdm's auto mode decides where it shows: a widget in a notebook, a
line on stderr when stderr is a terminal, nothing in a pipe or a log; `progress=True` shows it
anyway, `False` never. The line is erased when the work ends, so output and error messages
read as if it were not there. Without tqdm installed it falls back to plain lines on stderr
(no carriage returns or escape codes), shown where the terminal test says.
"""

from __future__ import annotations

import sys
import time
import warnings
from typing import Any, TextIO

_REDRAW_EVERY = 0.1  # seconds between redraws of a counter
_WIDTH = 100  # characters of description at most, so the line fits a terminal
_PHASE_FORMAT = "{desc} [{elapsed}]"
_COUNT_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} |{bar:12}| [{elapsed}<{remaining}]"
_COUNTER_FORMAT = "{desc}: {n_fmt} {unit} [{elapsed}]"


def enabled_for(stream: Any, progress: bool | None) -> bool:
    """`progress` as given, or (None) whether `stream` is a terminal."""
    if progress is not None:
        return bool(progress)
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # a closed or detached stream
        return False


def _bar_class() -> Any | None:
    """tqdm.auto's class (the notebook widget in a notebook, else the terminal bar), or None
    when tqdm is not installed."""
    try:
        with warnings.catch_warnings():  # auto mode's notice that it chose the notebook bar
            warnings.simplefilter("ignore")
            from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """`with Progress("loading") as bar: bar.phase("reading"); bar.count(3, 10, "cases")`.

    `progress=None` shows it where tqdm's auto mode would (a notebook, or stderr when it is a
    terminal), True always, False never."""

    def __init__(self, label: str, progress: bool | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.started = time.monotonic()
        self._bar: Any = None
        self._plain = False
        self._last_draw = 0.0
        self._last_line = ""
        if progress is False:
            return
        bar_class = _bar_class()
        if bar_class is None:
            self._plain = enabled_for(self.stream, progress)
            return
        try:
            bar = bar_class(total=None, desc=self._describe(""), file=self.stream, leave=False,
                            disable=None if progress is None else False,
                            bar_format=_PHASE_FORMAT, mininterval=_REDRAW_EVERY,
                            dynamic_ncols=True)
        except Exception:  # a display that cannot show a bar: progress is not worth an error
            return
        if not bar.disable:
            self._bar = bar

    @property
    def enabled(self) -> bool:
        return self._bar is not None or self._plain

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.clear()

    def phase(self, text: str) -> None:
        """Show what is being done now."""
        if self._bar is not None:
            self._guarded(lambda bar: (setattr(bar, "bar_format", _PHASE_FORMAT),
                                       bar.set_description_str(self._describe(text))))
        elif self._plain:
            self._line(self._describe(text))

    def count(self, done: int, total: int | None, unit: str = "") -> None:
        """Show `done` of `total` (redrawn at most every 0.1 s, and always at the end)."""
        now = time.monotonic()
        final = total is not None and done >= total
        if not final and now - self._last_draw < _REDRAW_EVERY:
            return
        self._last_draw = now
        if self._bar is not None:
            def draw(bar: Any) -> None:
                bar.bar_format = _COUNT_FORMAT if total else _COUNTER_FORMAT
                bar.total, bar.unit, bar.n = total, unit, done
                bar.set_description_str(self._describe(""), refresh=False)
                bar.refresh()

            self._guarded(draw)
        elif self._plain:
            amount = f"{done}/{total}" if total else f"{done}"
            self._line(f"{self._describe('')}: {amount} {unit}".rstrip())

    def clear(self) -> None:
        """Erase the bar, if anything was shown."""
        if self._bar is not None:
            bar, self._bar = self._bar, None
            try:
                bar.close()
            except (OSError, ValueError):
                pass

    def _describe(self, text: str) -> str:
        line = f"exactdraft: {self.label}" + (f": {text}" if text else "")
        return line if len(line) <= _WIDTH else line[:_WIDTH - 3] + "..."

    def _guarded(self, draw: Any) -> None:
        try:
            draw(self._bar)
        except (OSError, ValueError):  # the terminal went away: progress is not worth an error
            self._bar = None

    def _line(self, line: str) -> None:
        """The plain fallback: one line per change, with the time since the start."""
        if line == self._last_line:
            return
        self._last_line = line
        try:
            self.stream.write(f"{line} ({time.monotonic() - self.started:.0f} s)\n")
            self.stream.flush()
        except (OSError, ValueError):
            self._plain = False
