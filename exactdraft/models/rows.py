"""The two ends of a pass: token ids checked on the way in, embedding rows taken, and the
logits (with the final hidden rows a drafter reads) on the way out.

Invariant: a bad token id or a pass past the context is refused with the id or the overrun
named before anything is computed; only the rows asked for are taken from a table (quantized
tables decode just those rows); and the final RMS norm is row invariant, so norming every row
for features changes no logit's bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.errors import ParameterError
from exactdraft.formats.table import QuantizedTensor
from exactdraft.models.target import Rows


def checked_tokens(tokens: Sequence[int], start: int, vocab_size: int,
                   max_context: int) -> np.ndarray:
    """Token ids as int64, or a ParameterError naming the first bad id or the overrun."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ParameterError("forward needs at least one token")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        raise ParameterError(f"token id {int(ids[bad[0]])} at index {int(bad[0])} is outside "
                             f"the vocabulary [0, {vocab_size})")
    if start + ids.size > max_context:
        raise ParameterError(f"{start + ids.size} positions exceed the model's context of "
                             f"{max_context}")
    return ids


def final_rows(be: Backend, hidden: Any, counts: Sequence[int], rows: Rows, norm: Any,
               eps: float, lm_head: Any, every_row: bool) -> tuple[list[np.ndarray], Any]:
    """The end of a pass whose parts hold `counts` consecutive rows of `hidden`: each part's
    logits (of its last row, or of all its rows), and with `every_row` each part's normed
    hidden rows on the host (else None). The norm is row invariant, so norming every row
    changes no logit's bits."""
    ends = np.cumsum(counts)
    normed = be.rms_norm(hidden, norm, eps) if every_row else None
    source = hidden if normed is None else normed
    if rows == "last":
        last = (ends - 1).tolist()
        source = be.concatenate([source[r:r + 1] for r in last]) if len(last) > 1 \
            else source[last[0]:last[0] + 1]
        sizes = [1] * len(counts)
    else:
        sizes = list(counts)
    if normed is None:
        source = be.rms_norm(source, norm, eps)
    logits = be.to_host(be.linear(source, lm_head))
    bounds = np.cumsum([0, *sizes])
    split = [logits[bounds[i]:bounds[i + 1]] for i in range(len(counts))]
    if normed is None:
        return split, None
    host = be.to_host(normed)
    return split, [host[end - count:end] for count, end in zip(counts, ends)]


def output_rows(table: Any, ids: np.ndarray, stored: bool) -> Any:
    """Rows `ids` of an output table: float32, or with `stored` blocks stay blocks."""
    if stored and isinstance(table, QuantizedTensor):
        return QuantizedTensor(table.format, np.ascontiguousarray(table.data[ids]),
                               (ids.size, table.shape[1]))
    return embedding_rows(table, ids)


def embedding_rows(table: Any, ids: np.ndarray) -> np.ndarray:
    """float32 rows [len(ids), H] of an embedding table, dequantizing only those rows."""
    take = getattr(table, "take_rows", None)
    if take is not None:
        return take(ids)
    return np.ascontiguousarray(np.asarray(table)[ids], dtype=np.float32)
