"""The command line in several local ranks: `exactdraft serve --tensor-parallel N` on one machine.

Invariant: every rank runs the very same command line, as torchrun would start it (so every rank
loads the same checkpoint with the same settings, which the ranks' fingerprint exchange then
confirms); rank 0 drives and serves, the others follow its passes; and no rank outlives the
command that started them (a server's ranks must not go on holding its port). A rank that ends
is reaped at once (no zombie) and the others are given a bounded time to end on their own (a
survivor names the lost rank; a server answers 503, then exits non-zero), then killed; SIGTERM
stops the ranks in order (rank 0 first, which shuts its server down and closes the run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

# How long the other ranks have to end on their own once one has ended (a survivor names the
# lost rank within the heartbeat's stale_s, then rank 0 answers 503 for the server's
# failure_exit_s and exits), and to stop in order after SIGTERM (rank 0 writes its prefix-cache
# file, then closes the run, which ends the others): past it they are killed.
GRACE_S = 30.0


def run_command_ranks(argv: Sequence[str], world_size: int, timeout_s: float | None = None,
                      grace_s: float = GRACE_S) -> int:
    """Run `python -m exactdraft ARGV` in world_size ranks on this machine, with
    torch.distributed's environment set. Returns 0 when every rank exited cleanly, else rank
    0's nonzero exit status or the first other one (1 for a rank ended by a signal or the
    timeout). A rank that ends is reaped at once (no zombie); once one has ended the others
    get grace_s to end on their own, then are killed. SIGTERM stops the ranks in order: rank 0
    gets SIGTERM (a server shuts down, saving its cache file, and closes the run, which ends
    the other ranks), and whatever still runs grace_s later is killed."""
    from exactdraft.parallel.ranks import end_with_parent, free_port, rank_environment

    port = free_port()
    ranks: list[subprocess.Popen] = []
    codes: list[int | None] = [None] * world_size

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    # Terminating the launcher ends its ranks too (signal handlers live on the main thread).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop) if main_thread else None
    orderly = False
    try:
        for rank in range(world_size):
            env = dict(os.environ, **rank_environment(rank, world_size, port))
            ranks.append(subprocess.Popen([sys.executable, "-m", "exactdraft", *argv], env=env,
                                          preexec_fn=end_with_parent))
        _watch(ranks, codes, None if timeout_s is None else time.monotonic() + timeout_s,
               grace_s)
    except SystemExit:  # SIGTERM: stopped in order below; the ranks' statuses say the rest
        orderly = True
    except KeyboardInterrupt:
        orderly = True
        raise
    finally:  # interrupted, terminated or past the deadline: no rank goes on alone
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if orderly and ranks and ranks[0].poll() is None:
            ranks[0].terminate()
            _watch(ranks, codes, time.monotonic() + grace_s, grace_s, report=False)
            if codes[0] == -signal.SIGTERM:  # a server ends by the signal it was stopped by
                codes[0] = 0
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
    failed = [code for code in codes if code != 0]
    return 0 if not failed else (failed[0] if isinstance(failed[0], int) and failed[0] > 0
                                 else 1)


def _watch(ranks: list[subprocess.Popen], codes: list[int | None], deadline: float | None,
           grace_s: float, report: bool = True) -> None:
    """Poll the ranks (reaping each as it ends) until all have ended, the deadline passes, or
    grace_s has passed since the first one ended; codes[r] is rank r's exit status. With
    `report`, the first rank to fail is named on stderr."""
    first_end = None
    while True:
        for rank, process in enumerate(ranks):
            if codes[rank] is None:
                codes[rank] = process.poll()
                if report and codes[rank] not in (None, 0) and first_end is None:
                    print(f"exactdraft: tensor parallel rank {rank} ended with "
                          f"{_status_text(codes[rank])}; the other ranks end within "
                          f"{grace_s:.0f} s", file=sys.stderr, flush=True)
        now = time.monotonic()
        if first_end is None and any(code is not None for code in codes):
            first_end = now
        if all(code is not None for code in codes) or \
                (deadline is not None and now > deadline) or \
                (first_end is not None and now - first_end > grace_s):
            return
        time.sleep(0.1)


def _status_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit status {code}"
