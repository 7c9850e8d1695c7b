"""The conversations of recent Responses API responses, for `previous_response_id`.

Invariant: the store holds at most `capacity` conversations, in this process's memory only
(none survives a restart or is shared between replicas); a response is found by its id until
`capacity` newer ones have been kept, and an id not held is refused with a RequestError naming
`previous_response_id`. A conversation is its chat messages up to and including the
response's own output, without the request's instructions (which, as in OpenAI's API, a
following request does not inherit).
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from typing import Any

from exactdraft.server.fields import RequestError

STORED_RESPONSES = 256


class ResponseStore:
    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self.kept: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def keep(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self.kept[response_id] = copy.deepcopy(messages)
        while len(self.kept) > self.capacity:
            self.kept.popitem(last=False)

    def conversation(self, response_id: Any) -> list[dict[str, Any]]:
        """A copy of the conversation of `response_id`, refused when it is not held."""
        if not isinstance(response_id, str):
            raise RequestError("previous_response_id must be a string",
                               "previous_response_id")
        if response_id not in self.kept:
            raise RequestError(
                f"previous_response_id {json.dumps(response_id)[:80]} is not held by this "
                f"server (it keeps the last {self.capacity} stored responses in memory, since "
                "it started); send the whole conversation in input", "previous_response_id")
        return copy.deepcopy(self.kept[response_id])
