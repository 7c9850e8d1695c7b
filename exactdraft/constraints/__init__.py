"""Constraints on generated text: what a constraint is (`constraint`), the kinds there are
(`kinds`), the per-generation matcher and its mask (`matcher`), the tokenizer's bytes for
llguidance (`tokens`), and a constraint inside the decoding loop (`rows`).

Invariant: the mask of the row at position p is a pure function of the tokens generated before p,
whichever pass holds the row, so a constraint changes which tokens can be drawn but never lets a
drafted run differ from a serial one.
"""

from exactdraft.constraints.constraint import Constraint, parse_json
from exactdraft.constraints.matcher import ConstraintMatcher, apply_mask

__all__ = ["Constraint", "ConstraintMatcher", "apply_mask", "parse_json"]
