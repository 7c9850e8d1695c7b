"""Serving many requests from one Generator: shared passes (continuous batching), `n` samples
per request with derived seeds, asyncio streaming, and an exact prefix cache, every output
equal to the same request run alone."""

from exactdraft.engine.cache_file import CacheFileError
from exactdraft.engine.cache_file import load as load_prefix_cache
from exactdraft.engine.cache_file import save as save_prefix_cache
from exactdraft.engine.prefix_cache import PrefixCache
from exactdraft.engine.scheduler import Engine, EngineStats
from exactdraft.engine.submission import EngineFailed, QueueFull, Submission, sample_seed

__all__ = ["CacheFileError", "Engine", "EngineFailed", "EngineStats", "PrefixCache", "QueueFull",
           "Submission", "load_prefix_cache", "sample_seed", "save_prefix_cache"]
