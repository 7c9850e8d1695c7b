"""exactdraft: drafted (speculative) generation whose output is byte-identical to serial output.

    import exactdraft as xd
    gen = xd.Generator.from_pretrained("path/to/model", drafter=xd.PromptLookup())
    out = gen.generate("Hello", max_new_tokens=64, temperature=0.7, seed=7)
"""

from exactdraft.drafters import (
    DraftContext,
    Drafter,
    DraftHead,
    DraftModel,
    DraftTree,
    FallbackDrafter,
    MTPDrafter,
    PromptLookup,
    SuffixDrafter,
)
from exactdraft.errors import (
    BackendError,
    CheckpointError,
    ConfigError,
    ExactdraftError,
    ExactnessError,
    GGUFError,
    ParameterError,
    RecordingError,
    TokenizerError,
    WeightError,
)
from exactdraft.generator import Chunk, GenerationResult, GenerationStats, Generator, Stream
from exactdraft.sampling import KeyedSampler, SamplingParams
from exactdraft.verify import ExactVerifier, Verdict, Verifier

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "CheckpointError",
    "Chunk",
    "ConfigError",
    "DraftContext",
    "DraftHead",
    "DraftModel",
    "DraftTree",
    "Drafter",
    "ExactVerifier",
    "ExactdraftError",
    "ExactnessError",
    "FallbackDrafter",
    "GGUFError",
    "GenerationResult",
    "GenerationStats",
    "Generator",
    "KeyedSampler",
    "MTPDrafter",
    "ParameterError",
    "PromptLookup",
    "SuffixDrafter",
    "RecordingError",
    "SamplingParams",
    "Stream",
    "TokenizerError",
    "Verdict",
    "Verifier",
    "WeightError",
]
