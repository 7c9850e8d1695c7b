"""The settings of a tensor-parallel run and its error class.

Invariant: a run's settings are plain arguments, checked before anything starts; every failure
of a rank or of the transport reaches the caller as TensorParallelError naming the rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from exactdraft.errors import ExactdraftError, ParameterError


class TensorParallelError(ExactdraftError, RuntimeError):
    """A tensor-parallel rank died, hung, or disagrees with the others; the message names it."""


@dataclass(frozen=True)
class ParallelSettings:
    """world_size ranks (torch.distributed's WORLD_SIZE); a collective that does not finish
    within timeout_s fails; each rank beats every heartbeat_s seconds and a rank silent for
    stale_s is taken for dead; threads_per_rank: C kernel threads per rank (None: this
    machine's CPUs divided by the ranks on it)."""

    world_size: int
    timeout_s: float = 120.0
    heartbeat_s: float = 0.5
    stale_s: float = 5.0
    threads_per_rank: int | None = None

    def __post_init__(self) -> None:
        checked_world_size(self.world_size, "tensor_parallel")
        for name in ("timeout_s", "heartbeat_s", "stale_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ParameterError(f"{name} must be a positive number of seconds, got "
                                     f"{value!r}")
        if self.stale_s <= 2 * self.heartbeat_s:
            raise ParameterError(f"stale_s ({self.stale_s}) must exceed two heartbeats "
                                 f"({2 * self.heartbeat_s} s)")
        threads = self.threads_per_rank
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ParameterError(f"threads_per_rank must be an integer >= 1 or None, got "
                                 f"{threads!r}")


def checked_world_size(value: object, name: str = "world_size") -> int:
    """A rank count: ParameterError naming `name` unless an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParameterError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def parallel_settings(value: int | ParallelSettings) -> ParallelSettings:
    """ParallelSettings from the `tensor_parallel` argument (a rank count or the settings)."""
    return value if isinstance(value, ParallelSettings) else ParallelSettings(value)
