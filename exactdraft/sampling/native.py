"""The draw of SAMPLER.md (steps 3-9) through the optional C extension exactdraft._sampler.

Invariant: `draw(x, params, pos)` returns the token SAMPLER.md defines for the processed float64
row x, the same token the numpy path in exactdraft.sampling returns, and raises ValueError where
that path raises. The extension computes with the C twins of exactdraft's own exp and log
(csrc/sampler/float64_math.h), so it decides every top-p cut and every near-tie exactly with no
fallback (the argument is in csrc/sampler/draw.c).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exactdraft.errors import BackendError

if TYPE_CHECKING:
    from exactdraft.sampling.params import SamplingParams

try:
    from exactdraft import _sampler as _native

    _UNAVAILABLE_REASON: str | None = None
except ImportError as _error:
    _native = None
    _UNAVAILABLE_REASON = (
        f"the C extension exactdraft._sampler is not built ({_error}); it is compiled when the "
        "package is installed with a C compiler present (gcc or clang): reinstall with "
        "`pip install .` and read the build log's warning if it still fails"
    )

_MASK = (1 << 64) - 1


class NativeSamplerUnavailable(BackendError):
    """The C extension is missing; the message says why."""


def available() -> bool:
    """Whether the compiled draw can run in this process."""
    return _native is not None


def unavailable_reason() -> str | None:
    """Why the compiled draw cannot run, or None when it can."""
    return _UNAVAILABLE_REASON


def draw(x: Any, params: SamplingParams, pos: int) -> int:
    """Steps 3-9 of SAMPLER.md on x, the row after step 2 (a C-contiguous 1-D float64 array,
    or float32, which is widened exactly), for the token at absolute position `pos`."""
    return _native_draw(x, None, params, pos)


def draw_among(x: Any, tokens: Any, params: SamplingParams, pos: int) -> int:
    """`draw` among the listed tokens alone: x[i] (float64 or float32, C-contiguous) is the
    row's value of token tokens[i] (int64, strictly ascending, the noise keyed by it); returns
    the index i of the winner."""
    return _native_draw(x, tokens, params, pos)


def _native_draw(x: Any, tokens: Any | None, params: SamplingParams, pos: int) -> int:
    if _native is None:
        raise NativeSamplerUnavailable(_UNAVAILABLE_REASON)
    params.check_drawable()
    # The noise key uses pos modulo 2**64, as the Python key does for any integer.
    arguments = (params.temperature, params.top_k, params.top_p, params.min_p,
                 params.seed or 0, pos & _MASK)
    if tokens is None:
        return _native.draw(x, *arguments)
    return _native.draw_among(x, tokens, *arguments)
