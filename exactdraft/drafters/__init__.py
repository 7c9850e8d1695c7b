"""Drafters: cheap guesses of the next tokens, checked by the Verifier."""

from exactdraft.drafters.base import DraftContext, Drafter
from exactdraft.drafters.draft_model import DraftModel
from exactdraft.drafters.prompt_lookup import PromptLookup

__all__ = ["DraftContext", "DraftModel", "Drafter", "PromptLookup"]
