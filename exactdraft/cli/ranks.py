"""The command line in several local ranks: `exactdraft serve --tensor-parallel N` on one machine.

Invariant: every rank runs the very same command line, as torchrun would start it (so every rank
loads the same checkpoint with the same settings, which the ranks' fingerprint exchange then
confirms); rank 0 drives and serves, the others follow its passes; and no rank outlives the
command that started them (a server's ranks must not go on holding its port).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence


def _end_with_launcher() -> None:  # runs in each rank before it starts (Linux)
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_command_ranks(argv: Sequence[str], world_size: int,
                      timeout_s: float | None = None) -> int:
    """Run `python -m exactdraft ARGV` in world_size ranks on this machine, with
    torch.distributed's environment set. Returns 0 when every rank exited cleanly, else the
    first nonzero exit status (1 for a rank ended by a signal or the timeout)."""
    from exactdraft.parallel.ranks import free_port

    port = str(free_port())
    linux = sys.platform.startswith("linux")
    ranks = []

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    # Terminating the launcher ends its ranks too (signal handlers live on the main thread).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if main_thread else None
    try:
        for rank in range(world_size):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size),
                       LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            ranks.append(subprocess.Popen([sys.executable, "-m", "exactdraft", *argv], env=env,
                                          preexec_fn=_end_with_launcher if linux else None))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        codes = []
        for process in ranks:
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                codes.append(process.wait(left))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:  # interrupted, terminated or past the deadline: no rank goes on alone
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
    failed = [code for code in codes if code != 0]
    return 0 if not failed else (failed[0] if isinstance(failed[0], int) and failed[0] > 0
                                 else 1)
