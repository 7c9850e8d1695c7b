"""Sampling: the settings (`params`), the keyed draw every token is (`keyed`), and the same draw
in C (`native`).

Invariant: the token drawn for a row is a pure function of (the row's float32 logits, the
sampling parameters, the token history, the seed, the absolute position), as SAMPLER.md defines
it, whichever of the two implementations runs.
"""

from exactdraft.sampling.keyed import (
    MAX_TOP_LOGPROBS,
    KeyedSampler,
    TokenLogprob,
    gumbel_noise,
    keyed_uniform,
    mix64,
    noise_key,
)
from exactdraft.sampling.params import (
    REQUEST_FIELDS,
    SAMPLING_FIELDS,
    SamplingParams,
    fresh_seed,
    sampling_from,
)

__all__ = ["MAX_TOP_LOGPROBS", "REQUEST_FIELDS", "SAMPLING_FIELDS", "KeyedSampler",
           "SamplingParams", "TokenLogprob", "fresh_seed", "gumbel_noise", "keyed_uniform",
           "mix64", "noise_key", "sampling_from"]
