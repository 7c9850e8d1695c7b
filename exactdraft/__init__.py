"""exactdraft: drafted (speculative) generation whose output is byte-identical to serial output.

    import exactdraft as xd
    gen = xd.Generator.from_pretrained("path/to/model", drafter=xd.PromptLookup())
    out = gen.generate("Hello", max_new_tokens=64, sampling=xd.SamplingParams(seed=7))
"""

from exactdraft.drafters import DraftContext, Drafter, DraftModel, PromptLookup
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
from exactdraft.generator import Chunk, GenerationResult, GenerationStats, Generator
from exactdraft.sampling import KeyedSampler, SamplingParams
from exactdraft.verify import ExactVerifier, Verdict, Verifier

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "CheckpointError",
    "Chunk",
    "ConfigError",
    "DraftContext",
    "DraftModel",
    "Drafter",
    "ExactVerifier",
    "ExactdraftError",
    "ExactnessError",
    "GGUFError",
    "GenerationResult",
    "GenerationStats",
    "Generator",
    "KeyedSampler",
    "ParameterError",
    "PromptLookup",
    "RecordingError",
    "SamplingParams",
    "TokenizerError",
    "Verdict",
    "Verifier",
    "WeightError",
]
