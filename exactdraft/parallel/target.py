"""Rank 0's Target for a tensor-parallel model, and the loop the other ranks run.

Invariant: the Generator and the Engine on rank 0 see a Target whose every call returns the
bits the TP=1 model returns: TensorParallelTarget publishes each call that runs a pass or
changes a state (new_state, forward, forward_batch, forward_tree, truncate, commit_tree,
import_kv, dropped states) before running it, and `follow` replays the calls on every other
rank in the same order, so the ranks meet in the same collectives and hold the same caches
(whole, or each its own heads). Calls that only read what rank 0 holds (embedding_rows,
output_rows, the weights digest, and export_kv unless the KV heads are split across the ranks)
run on rank 0 alone. Arguments are checked on rank 0 before anything is published, so a bad
call raises there and reaches no other rank.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft.errors import ExactdraftError, ParameterError
from exactdraft.models.target import capabilities_of
from exactdraft.parallel.commands import CommandReceiver, CommandSender
from exactdraft.parallel.group import ParallelGroup
from exactdraft.parallel.settings import TensorParallelError


class ParallelState:
    """A sequence's state on rank 0 (`local`), known to the other ranks by `id`."""

    def __init__(self, owner: TensorParallelTarget, ident: int, local: Any) -> None:
        self.owner, self.id, self.local = owner, ident, local

    @property
    def length(self) -> int:
        return self.local.length


class TensorParallelTarget:
    """The Target protocol over a model split across ranks, run from rank 0."""

    def __init__(self, model: Any, group: ParallelGroup) -> None:
        if group.rank != 0:
            raise ParameterError(f"TensorParallelTarget runs on rank 0, not rank {group.rank}")
        self.model, self.group = model, group
        self.sender = CommandSender(group)
        self._lock = threading.RLock()
        self._next_id = 0
        self._dropped: list[int] = []
        self.closed = False
        for name in ("vocab_size", "max_context", "key_block", "eos_token_ids", "arithmetic"):
            setattr(self, name, getattr(model, name))
        # What the model declares, less the MTP layers (their keep_hidden and state_holding
        # are not replayed on the other ranks).
        self.capabilities = dataclasses.replace(capabilities_of(model), carries_mtp=False,
                                                spans_ranks=True)
        for name in ("config", "head_shape"):
            try:
                setattr(self, name, getattr(model, name))
            except (AttributeError, ParameterError):
                pass
        # Drafters that compute on the target's backend (draft heads) run on rank 0 alone,
        # on the wrapped backend, never in the ranks' collectives.
        self.backend = model.backend.inner

    def __repr__(self) -> str:
        return f"TensorParallelTarget({self.model!r}, {self.group.world_size} ranks)"

    @property
    def supports_trees(self) -> bool:
        return self.capabilities.verifies_trees

    def _checked(self, tokens: Sequence[int], start: int) -> list[int]:
        """Token ids as the model checks them (ParameterError naming a bad one)."""
        from exactdraft.models.rows import checked_tokens

        return checked_tokens(tokens, start, self.vocab_size, self.max_context).tolist()

    @property
    def bytes_sent(self) -> int:
        """Payload bytes rank 0 has sent to the other ranks in gathers and broadcasts."""
        return self.group.bytes_sent

    # -- publishing -----------------------------------------------------------------------

    def _send(self, command: dict[str, Any]) -> None:
        if self.closed:
            raise TensorParallelError("this tensor-parallel target is closed")
        if self._dropped:
            dropped, self._dropped = self._dropped, []
            self.sender.send({"op": "drop", "ids": dropped})
        self.sender.send(command)

    def _local(self, state: Any) -> Any:
        if not isinstance(state, ParallelState) or state.owner is not self:
            raise ParameterError(f"{state!r} is not a state of this tensor-parallel target")
        return state.local

    # -- Target protocol ------------------------------------------------------------------

    def new_state(self) -> ParallelState:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            self._send({"op": "new", "id": ident})
            state = ParallelState(self, ident, self.model.new_state())
            weakref.finalize(state, self._dropped.append, ident)
            return state

    def forward(self, state: Any, tokens: Sequence[int], rows: str = "last",
                features: bool = False) -> Any:
        out = self.forward_batch([state], [tokens], rows, features)
        return (out[0][0], out[1][0]) if features else out[0]

    def forward_tree(self, state: Any, tokens: Sequence[int], parents: Sequence[int],
                     features: bool = False) -> Any:
        out = self.forward_batch([state], [tokens], "all", features, parents=[parents])
        return (out[0][0], out[1][0]) if features else out[0]

    def forward_batch(self, states: Sequence[Any], token_lists: Sequence[Sequence[int]],
                      rows: str = "last", features: bool = False,
                      parents: Sequence[Sequence[int] | None] | None = None) -> Any:
        with self._lock:
            locals_ = [self._local(state) for state in states]
            if rows not in ("last", "all"):
                raise ParameterError(f"rows must be 'last' or 'all', got {rows!r}")
            if len(states) != len(token_lists) or not states:
                raise ParameterError(f"forward_batch needs one token list per state, got "
                                     f"{len(states)} states and {len(token_lists)} token lists")
            ids = [self._checked(tokens, local.length)
                   for tokens, local in zip(token_lists, locals_)]
            trees = None if parents is None else [
                None if tree is None else [int(p) for p in np.asarray(tree).reshape(-1)]
                for tree in parents]
            if trees is not None and not self.supports_trees:
                raise ParameterError(f"{self.model!r} cannot verify token trees")
            self._send({"op": "pass", "ids": [state.id for state in states], "tokens": ids,
                        "rows": rows, "features": bool(features), "parents": trees})
            return run_pass(self.model, locals_, ids, rows, features, trees)

    def truncate(self, state: Any, length: int) -> None:
        with self._lock:
            local = self._local(state)
            if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or \
                    not 0 <= length <= local.length:
                raise ParameterError(f"cannot truncate a state of length {local.length} to "
                                     f"{length!r}")
            self._send({"op": "truncate", "id": state.id, "length": int(length)})
            self.model.truncate(local, int(length))

    def commit_tree(self, state: Any, path: Sequence[int]) -> None:
        with self._lock:
            local = self._local(state)
            if getattr(local, "tree", None) is None:
                raise ParameterError("commit_tree needs a forward_tree pass first")
            steps = [int(row) for row in np.asarray(path).reshape(-1)]
            from exactdraft.models.token_tree import check_path

            check_path(local.tree[1], steps)
            self._send({"op": "commit_tree", "id": state.id, "path": steps})
            self.model.commit_tree(local, steps)

    def export_kv(self, state: Any, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            local = self._local(state)
            if getattr(self.model, "collective_export", False):  # the heads live on the ranks
                if isinstance(start, bool) or isinstance(end, bool) or \
                        not 0 <= int(start) <= int(end) <= local.length:
                    raise ParameterError(f"cannot export positions [{start}, {end}) of a "
                                         f"state holding {local.length}")
                self._send({"op": "export_kv", "id": state.id, "start": int(start),
                            "end": int(end)})
            return self.model.export_kv(local, start, end)

    def import_kv(self, state: Any, keys: np.ndarray, values: np.ndarray) -> None:
        import torch

        with self._lock:
            local = self._local(state)
            keys = np.ascontiguousarray(keys, dtype=np.float32)
            values = np.ascontiguousarray(values, dtype=np.float32)
            if keys.shape != values.shape or keys.ndim != 4:
                raise ParameterError(f"import_kv needs keys and values of one 4-D shape, got "
                                     f"{keys.shape} and {values.shape}")
            self._send({"op": "import_kv", "id": state.id, "shape": list(keys.shape)})
            for array in (keys, values):
                self.group.broadcast(torch.from_numpy(array), "an import_kv broadcast")
            self.model.import_kv(local, keys, values)

    def embedding_rows(self, ids: Any) -> np.ndarray:
        return self.model.embedding_rows(ids)

    def output_rows(self, ids: Any, stored: bool = False) -> Any:
        return self.model.output_rows(ids, stored)

    def weights_digest(self) -> str:
        return self.model.weights_digest()

    def check(self) -> None:
        """Raise TensorParallelError naming the rank once any rank is known to be gone or
        stuck (its heartbeat), also between passes."""
        self.group.check()

    def close(self) -> None:
        """Tell the other ranks to stop following and leave the group (idempotent)."""
        with self._lock:
            if self.closed or self.group.failed is not None:
                self.closed = True
                return
            self._send({"op": "close"})
            self.closed = True
            try:
                self.group.barrier("closing")
            finally:
                self.group.close()


def run_pass(model: Any, states: list[Any], ids: list[list[int]], rows: str, features: bool,
             trees: list[list[int] | None] | None) -> Any:
    """model.forward_batch, with token trees only when there are any (models without trees
    take no `parents`)."""
    if trees is None:
        return model.forward_batch(states, ids, rows, features)
    return model.forward_batch(states, ids, rows, features, parents=trees)


def follow(model: Any, group: ParallelGroup) -> None:
    """Run rank 0's calls on this rank until rank 0 closes the run; raises TensorParallelError
    naming the rank when another rank dies or hangs."""
    import torch

    receiver, states = CommandReceiver(group), {}
    while True:
        command = receiver.receive()
        op = command["op"]
        if op == "close":
            group.barrier("closing")
            group.close()
            return
        try:
            if op == "new":
                states[command["id"]] = model.new_state()
            elif op == "drop":
                for ident in command["ids"]:
                    states.pop(ident, None)
            elif op == "pass":
                run_pass(model, [states[i] for i in command["ids"]], command["tokens"],
                         command["rows"], command["features"], command["parents"])
            elif op == "truncate":
                model.truncate(states[command["id"]], command["length"])
            elif op == "commit_tree":
                model.commit_tree(states[command["id"]], command["path"])
            elif op == "export_kv":
                model.export_kv(states[command["id"]], command["start"], command["end"])
            elif op == "import_kv":
                arrays = [np.empty(command["shape"], np.float32) for _ in range(2)]
                for array in arrays:
                    group.broadcast(torch.from_numpy(array), "an import_kv broadcast")
                model.import_kv(states[command["id"]], *arrays)
            else:
                raise TensorParallelError(f"rank {group.rank} got an unknown command {op!r}")
        except TensorParallelError:
            raise
        except ExactdraftError:
            continue  # rank 0 raised the same error for the same call
