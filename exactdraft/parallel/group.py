"""The ranks of a tensor-parallel run: the gloo process group, a heartbeat that names a rank that
dies or stops, and the checks that turn every transport failure into TensorParallelError.

Invariant: no rank waits without a bound. A collective waits at most settings.timeout_s (gloo's
own timeout); between passes a rank waits on the store in steps of one heartbeat and stops as
soon as another rank's heartbeat has been silent for settings.stale_s. When a collective fails,
the error names the rank whose heartbeat stopped (or, if every rank still beats, how far each
one got), so a dead or stuck rank is reported by the ranks that survive it, never as a hang.
Nothing here computes; ranks exchange only what they already hold.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np

from exactdraft.errors import ParameterError
from exactdraft.parallel.settings import ParallelSettings, TensorParallelError

_ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def environment_rank(settings: ParallelSettings) -> tuple[int, str, int]:
    """(rank, store host, store port) from torch.distributed's environment, checked against
    the settings; a ParameterError says how to start the ranks when it is missing."""
    missing = [name for name in _ENVIRONMENT if name not in os.environ]
    if missing:
        raise ParameterError(
            f"tensor_parallel={settings.world_size} needs torch.distributed's environment "
            f"({', '.join(missing)} unset): start the ranks with `torchrun --nproc-per-node "
            f"{settings.world_size} script.py` or exactdraft.parallel.launch")
    world = int(os.environ["WORLD_SIZE"])
    if world != settings.world_size:
        raise ParameterError(f"tensor_parallel={settings.world_size} but torch.distributed's "
                             f"WORLD_SIZE is {world}; they must be equal")
    return int(os.environ["RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


class Heartbeat:
    """A thread that beats for this rank on its own store connection and watches the others:
    `failure` becomes a sentence naming the first rank found silent (or the lost store)."""

    def __init__(self, store: Any, rank: int, world_size: int, settings: ParallelSettings,
                 where: str) -> None:
        self.store, self.rank, self.world_size, self.settings = store, rank, world_size, settings
        self.where = where
        self.progress = 0  # the number of the command this rank is at (set by its owner)
        self.collectives = 0  # collectives this rank has entered (set by its group)
        self.failure: str | None = None
        self.seen: dict[int, tuple[bytes, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tp-heartbeat-{rank}",
                                        daemon=True)

    def start(self) -> None:
        now = time.monotonic()
        self.seen = {r: (b"", now) for r in range(self.world_size) if r != self.rank}
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.settings.heartbeat_s)

    def behind(self) -> dict[int, tuple[int, int]]:
        """The other ranks that have entered fewer collectives than this one, by the last beat
        seen: rank -> (its command, its collectives)."""
        lagging = {}
        for other, (value, _) in sorted(self.seen.items()):
            fields = value.decode().split()
            if len(fields) == 3 and int(fields[2]) < self.collectives:
                lagging[other] = (int(fields[1]), int(fields[2]))
        return lagging

    def _run(self) -> None:
        count, store_lost_since = 0, None
        # Once a failure is known the run is over: stop beating (and reporting the same loss).
        while self.failure is None and not self._stop.wait(self.settings.heartbeat_s):
            count += 1
            now = time.monotonic()
            try:
                self.store.set(f"beat/{self.rank}",
                               f"{count} {self.progress} {self.collectives}")
                for other, (value, since) in list(self.seen.items()):
                    latest = self.store.get(f"beat/{other}")
                    if latest != value:
                        self.seen[other] = (latest, now)
                    elif now - since > self.settings.stale_s and self.failure is None:
                        self.failure = (f"tensor parallel rank {other} is gone: no heartbeat "
                                        f"for {now - since:.1f} s (it died, was stopped, or "
                                        "lost its connection)")
                store_lost_since = None
            except Exception as error:  # noqa: BLE001  (any store failure means the same)
                store_lost_since = store_lost_since or now
                if now - store_lost_since > self.settings.stale_s and self.failure is None:
                    self.failure = (f"tensor parallel rank 0 is gone: the store at {self.where} "
                                    f"no longer answers ({error}); rank 0 hosts it under "
                                    "exactdraft.parallel.launch, the torchrun agent otherwise")


class ParallelGroup:
    """This process's place in a tensor-parallel run: rank, world size, the gloo group, the
    store (commands and agreement) and the heartbeat."""

    def __init__(self, settings: ParallelSettings) -> None:
        import torch
        import torch.distributed as dist

        self.settings = settings
        self.rank, host, port = environment_rank(settings)
        self.world_size = settings.world_size
        self._dist, self._torch = dist, torch
        timeout = timedelta(seconds=settings.timeout_s)
        self.owns_default_group = not dist.is_initialized()
        try:
            if self.owns_default_group:
                dist.init_process_group("gloo", timeout=timeout)
                self.group = None
            else:
                self.group = dist.new_group(backend="gloo", timeout=timeout)
        except RuntimeError as error:  # a rank that never came, an address in use
            raise TensorParallelError(
                f"tensor parallel rank {self.rank} could not join the {self.world_size} ranks "
                f"at {host}:{port} within timeout_s={settings.timeout_s}: {error}") from error
        self.failed: TensorParallelError | None = None
        # A name for this run's store keys (no draw from torch's global generator, which a
        # caller's seeding would make repeat across runs).
        run = torch.tensor([secrets.randbits(62)], dtype=torch.int64)
        self._collective(lambda: dist.broadcast(run, 0, group=self.group), "start")
        prefix = f"exactdraft-tp/{int(run)}/"
        self.where = f"{host}:{port}"
        self.store = self._client(host, port, prefix)
        self.store.set(f"beat/{self.rank}", "0 0")
        self.barrier("start")
        self.heartbeat = Heartbeat(self._client(host, port, prefix), self.rank, self.world_size,
                                   settings, self.where)
        self.heartbeat.start()
        self.bytes_sent = 0  # payload bytes this rank has sent in gathers and broadcasts

    def _client(self, host: str, port: int, prefix: str) -> Any:
        dist = self._dist
        client = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=self.settings.stale_s))
        return dist.PrefixStore(prefix, client)

    # -- failures -------------------------------------------------------------------------

    def check(self) -> None:
        """Raise the run's failure, if any rank is known to have failed."""
        if self.failed is not None:
            raise self.failed
        if self.heartbeat_failure() is not None:
            self.failed = TensorParallelError(f"{self.heartbeat_failure()} (seen by rank "
                                              f"{self.rank})")
            raise self.failed

    def heartbeat_failure(self) -> str | None:
        beat = getattr(self, "heartbeat", None)
        return None if beat is None else beat.failure

    def diagnose(self, error: BaseException, during: str) -> TensorParallelError:
        """The TensorParallelError for a failed collective: waits (at most stale_s and two
        heartbeats) for the heartbeat to name a silent rank."""
        deadline = time.monotonic() + self.settings.stale_s + 2 * self.settings.heartbeat_s
        beat = getattr(self, "heartbeat", None)
        while beat is not None and beat.failure is None and time.monotonic() < deadline:
            time.sleep(self.settings.heartbeat_s / 2)
        if beat is not None and beat.failure is not None:
            message = f"{beat.failure}; rank {self.rank} stopped during {during}: {error}"
        elif beat is not None and beat.behind():
            stuck = ", ".join(f"rank {r} (at command {command}, collective {entered + 1})"
                              for r, (command, entered) in beat.behind().items())
            message = (f"tensor parallel {stuck} is stuck: alive (its heartbeat beats) but not "
                       f"in the collective rank {self.rank} waited in for timeout_s="
                       f"{self.settings.timeout_s} (collective {beat.collectives}, during "
                       f"{during}): {error}")
        else:
            message = (f"tensor parallel {during} failed on rank {self.rank} while every rank's "
                       f"heartbeat is alive and has reached this collective: {error}")
        self.failed = TensorParallelError(message)
        return self.failed

    def _collective(self, call: Callable[[], Any], during: str) -> Any:
        self.check()
        beat = getattr(self, "heartbeat", None)
        if beat is not None:
            beat.collectives += 1
        try:
            return call()
        except TensorParallelError:
            raise
        except RuntimeError as error:  # gloo's errors: closed connections, timeouts
            raise self.diagnose(error, during) from error

    # -- collectives ----------------------------------------------------------------------

    def barrier(self, during: str) -> None:
        token = self._torch.zeros(1)
        self._collective(lambda: self._dist.all_reduce(token, group=self.group), during)

    def all_gather_columns(self, local: Any, widths: list[int]) -> Any:
        """The ranks' column blocks [M, widths[r]] side by side, in rank order: a copy, no
        arithmetic. Blocks are padded to the widest for the transport."""
        torch = self._torch
        widest = max(widths)
        send = local if local.shape[1] == widest else torch.nn.functional.pad(
            local, (0, widest - local.shape[1]))
        blocks = [torch.empty_like(send) for _ in widths]
        self._collective(lambda: self._dist.all_gather(blocks, send.contiguous(),
                                                       group=self.group), "a gather")
        self.bytes_sent += send.numel() * send.element_size() * (self.world_size - 1)
        return torch.cat([block[:, :width] for block, width in zip(blocks, widths)], dim=1)

    def all_gather_rows(self, local: np.ndarray, counts: list[int]) -> np.ndarray:
        """The ranks' row blocks [counts[r], W] stacked in rank order: a copy, no arithmetic.
        Blocks are padded to the tallest for the transport."""
        torch = self._torch
        tallest = max(counts)
        send = torch.zeros((tallest, local.shape[1]), dtype=torch.float32)
        send[:local.shape[0]] = torch.from_numpy(np.ascontiguousarray(local))
        blocks = [torch.empty_like(send) for _ in counts]
        self._collective(lambda: self._dist.all_gather(blocks, send, group=self.group),
                         "an expert gather")
        self.bytes_sent += send.numel() * send.element_size() * (self.world_size - 1)
        return torch.cat([block[:count] for block, count in zip(blocks, counts)]).numpy()

    def all_gather_heads(self, local: np.ndarray) -> np.ndarray:
        """The ranks' arrays [layers, heads_r, ...] joined along the heads, in rank order."""
        torch = self._torch
        send = torch.from_numpy(np.ascontiguousarray(local))
        blocks = [torch.empty_like(send) for _ in range(self.world_size)]
        self._collective(lambda: self._dist.all_gather(blocks, send, group=self.group),
                         "a KV export")
        self.bytes_sent += send.numel() * send.element_size() * (self.world_size - 1)
        return torch.cat(blocks, dim=1).numpy()

    def broadcast(self, tensor: Any, during: str) -> Any:
        """`tensor` on every rank as rank 0 holds it (in place)."""
        self._collective(lambda: self._dist.broadcast(tensor, 0, group=self.group), during)
        if self.rank == 0:
            self.bytes_sent += tensor.numel() * tensor.element_size() * (self.world_size - 1)
        return tensor

    # -- agreement ------------------------------------------------------------------------

    def agree(self, name: str, value: str) -> None:
        """Every rank states `value`; a TensorParallelError on every rank names the ranks
        whose value differs from rank 0's, with both values. Rank 0, whose process hosts the
        store, waits until every rank has read the values, so no rank finds the store gone
        instead of the disagreement."""
        self.store.set(f"agree/{name}/{self.rank}", value)
        keys = [f"agree/{name}/{r}" for r in range(self.world_size)]
        self._wait_for(keys, f"the {name} exchange")
        values = [self.store.get(key).decode() for key in keys]
        self.store.set(f"agree/{name}/read/{self.rank}", "1")
        if self.rank == 0:
            self._wait_for([f"agree/{name}/read/{r}" for r in range(self.world_size)],
                           f"the {name} exchange")
        differ = [r for r in range(1, self.world_size) if values[r] != values[0]]
        if differ:
            self.failed = TensorParallelError(
                f"tensor parallel ranks disagree on the {name}: rank {differ[0]} has "
                f"{values[differ[0]]!r}, rank 0 has {values[0]!r} (differing ranks: {differ})")
            raise self.failed

    def _wait_for(self, keys: list[str], during: str) -> None:
        """Until every key is in the store, polled (a timed wait that expires logs a c10d
        warning each time), a lost rank or the timeout raising TensorParallelError."""
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            self.check()
            try:
                if self.store.check(keys):
                    return
                waited: Exception = TimeoutError(f"not every rank reached {during}")
            except RuntimeError as error:
                waited = error
            if time.monotonic() > deadline:
                raise self.diagnose(waited, during) from waited
            time.sleep(self.settings.heartbeat_s / 5)

    def close(self) -> None:
        """Stop the heartbeat and leave the process group (a no-op once done)."""
        beat = getattr(self, "heartbeat", None)
        if beat is not None:
            beat.stop()
            self.heartbeat = None
            if self.owns_default_group and self._dist.is_initialized():
                self._dist.destroy_process_group()
