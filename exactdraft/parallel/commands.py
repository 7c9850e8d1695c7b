"""The command stream from the driving rank (rank 0) to the following ranks, through the store.

Invariant: followers run the driver's Target calls in the driver's order, one command at a
time, so every rank enters the same collectives in the same order. A command is JSON (ids,
token lists, flags: no pickle); command n is read by every follower exactly once and deleted
by the last one to read it. A follower polls the store for the next command (at most a
heartbeat apart; a poll logs nothing, where a timed wait that expires logs a warning) and
stops with the heartbeat's error when another rank is gone, so an idle driver is never
mistaken for a dead one and a dead one is never waited for without bound.
"""

from __future__ import annotations

import json
import time
from typing import Any

from exactdraft.parallel.group import ParallelGroup
from exactdraft.parallel.settings import TensorParallelError

# A follower looks for the next command after FIRST_POLL_S, then twice as long each time up to
# IDLE_POLL_S (or the heartbeat, if shorter).
FIRST_POLL_S = 0.0002
IDLE_POLL_S = 0.05


class CommandSender:
    """Rank 0's end: numbers and publishes commands."""

    def __init__(self, group: ParallelGroup) -> None:
        self.group = group
        self.sent = 0

    def send(self, command: dict[str, Any]) -> None:
        self.group.check()
        self.sent += 1
        payload = json.dumps(command, separators=(",", ":"))
        try:
            self.group.store.set(f"cmd/{self.sent}", payload)
        except RuntimeError as error:
            raise self.group.diagnose(error, f"sending command {self.sent}") from error
        self.group.heartbeat.progress = self.sent


class CommandReceiver:
    """A follower's end: reads the driver's commands in order."""

    def __init__(self, group: ParallelGroup) -> None:
        self.group = group
        self.received = 0

    def receive(self) -> dict[str, Any]:
        group, number = self.group, self.received + 1
        key, step = f"cmd/{number}", FIRST_POLL_S
        # Polled with check, not a timed wait: a wait that times out logs a c10d warning each
        # time, twice a second on an idle server. The poll starts fast (the next command of a
        # generation comes within the driver's sampling time) and slows while idle.
        while True:
            group.check()
            try:
                if group.store.check([key]):
                    break
            except RuntimeError:  # the store is gone: the heartbeat names the rank
                pass
            time.sleep(step)
            step = min(2 * step, IDLE_POLL_S, group.settings.heartbeat_s)
        try:
            payload = group.store.get(key)
            if group.store.add(f"ack/{number}", 1) == group.world_size - 1:
                group.store.delete_key(key)
                group.store.delete_key(f"ack/{number}")
        except RuntimeError as error:
            raise group.diagnose(error, f"reading command {number}") from error
        self.received = number
        group.heartbeat.progress = number
        try:
            return json.loads(payload)
        except ValueError as error:
            raise TensorParallelError(f"command {number} from rank 0 is not JSON: "
                                      f"{error}") from None
