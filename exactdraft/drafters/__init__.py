"""Drafters: cheap guesses of the next tokens, checked by the Verifier. Their spec names
(`lookup`, `head:PATH`, `lookup+head`, ...) are one table: exactdraft.drafters.registry."""

from exactdraft.drafters.base import DraftContext, Drafter, DrafterTraits, DraftTree, traits_of
from exactdraft.drafters.draft_model import DraftModel
from exactdraft.drafters.fallback import FallbackDrafter
from exactdraft.drafters.head import DraftHead
from exactdraft.drafters.mtp import MTPDrafter
from exactdraft.drafters.prompt_lookup import PromptLookup
from exactdraft.drafters.suffix import SuffixDrafter

__all__ = ["DraftContext", "DraftHead", "DraftModel", "DraftTree", "Drafter", "DrafterTraits",
           "FallbackDrafter", "MTPDrafter", "PromptLookup", "SuffixDrafter", "traits_of"]
