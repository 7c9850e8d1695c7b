"""Start the ranks of a tensor-parallel run on this machine, as torchrun would.

Invariant: each rank is a fresh process (torch.multiprocessing, spawn) with torch.distributed's
environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
MASTER_PORT) set before the function runs; a rank that dies is not killed along with the others
by the launcher: the survivors detect it (group.py) and stop with an error naming it. The
launcher only ends ranks still running past its own deadline. No rank outlives its launcher:
a launcher that is killed or interrupted takes its ranks with it (a server's ranks must not go
on holding its port).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from exactdraft.parallel.settings import checked_world_size


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def rank_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    """torch.distributed's environment for rank `rank` of a run on this machine (what
    torchrun sets)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def end_with_parent() -> None:
    """Ask the kernel to end this process when its parent ends (Linux's parent-death signal;
    elsewhere nothing)."""
    import signal
    import sys

    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _end_with(launcher: int) -> None:
    """End this process when the launcher process `launcher` ends: the kernel's parent-death
    signal on Linux, and a watch on the parent's id everywhere (it also covers a launcher that
    died before the signal was set)."""
    import threading

    end_with_parent()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exactdraft-launcher-watch", daemon=True).start()


def _rank_main(rank: int, world_size: int, port: int, function: Callable[..., Any],
               args: Sequence[Any], launcher: int) -> None:
    _end_with(launcher)
    os.environ.update(rank_environment(rank, world_size, port))
    function(*args)


def launch(function: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
           timeout_s: float | None = None) -> list[int | None]:
    """Run function(*args) in world_size new processes, one per rank, and wait for them all;
    returns their exit codes in rank order (None: still running at timeout_s, then ended).
    `function` must be importable by name (a module-level function)."""
    import torch.multiprocessing as mp

    checked_world_size(world_size)
    context = mp.get_context("spawn")
    port = free_port()
    processes = [context.Process(target=_rank_main, name=f"exactdraft-rank-{rank}",
                                 args=(rank, world_size, port, function, tuple(args),
                                       os.getpid()))
                 for rank in range(world_size)]
    codes: list[int | None] = []
    try:
        for process in processes:
            process.start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for process in processes:
            process.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for process in processes:
            codes.append(None if process.is_alive() else process.exitcode)
    finally:  # past the deadline, or the launcher interrupted: no rank goes on alone
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    return codes
