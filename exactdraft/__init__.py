"""exactdraft: drafted (speculative) generation whose output is byte-identical to serial output.

    import exactdraft as xd
    gen = xd.Generator.from_pretrained("path/to/model", drafter=xd.PromptLookup())
    out = gen.generate("Hello", max_new_tokens=64, temperature=0.7, seed=7)
"""

from exactdraft.constraints import Constraint
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
    ConstraintError,
    ExactdraftError,
    ExactnessError,
    GGUFError,
    ParameterError,
    RecordingError,
    TokenizerError,
    WeightError,
)
from exactdraft.generator import Generator, Stream
from exactdraft.models.target import Capabilities
from exactdraft.results import Chunk, GenerationResult, GenerationStats
from exactdraft.sampling import KeyedSampler, SamplingParams
from exactdraft.verify import ExactVerifier, NothingAllowed, RowTransform, Verdict, Verifier

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "Capabilities",
    "CheckpointError",
    "Chunk",
    "ConfigError",
    "Constraint",
    "ConstraintError",
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
    "NothingAllowed",
    "ParameterError",
    "PromptLookup",
    "SuffixDrafter",
    "RecordingError",
    "RowTransform",
    "SamplingParams",
    "Stream",
    "TokenizerError",
    "Verdict",
    "Verifier",
    "WeightError",
]
