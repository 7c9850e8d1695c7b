"""What every endpoint handler is given: the request and what the server's endpoints share.

Invariant: one Shared per application (its service, engine and served model name), one Call
per HTTP request; handlers read the shared parts and never keep per-request state elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exactdraft.engine import Engine
from exactdraft.server.service import Service


@dataclass
class Shared:
    service: Service
    engine: Engine
    model_name: str
    on_shutdown: Callable[[], None] | None = None


@dataclass
class Call:
    """One request on its way through an endpoint."""

    request: Any  # a starlette Request
    shared: Shared

    @property
    def service(self) -> Service:
        return self.shared.service

    async def body(self) -> dict[str, Any]:
        from exactdraft.server.fields import parse_body

        return parse_body(await self.request.body())
