"""Endpoints for operating the server: /health and /metrics (Prometheus text, metrics.py).

Invariant: they read the engine's state and change nothing.
"""

from __future__ import annotations

from typing import Any

from exactdraft.server.context import Call


async def health(call: Call) -> Any:
    from starlette.responses import JSONResponse

    engine = call.shared.engine
    running, waiting = engine.load
    return JSONResponse({"status": "ok", "model": call.shared.model_name, "running": running,
                         "waiting": waiting, "max_sequences": engine.max_sequences,
                         "max_waiting": engine.max_waiting,
                         "cancelled": engine.stats.cancelled})


async def metrics(call: Call) -> Any:
    from starlette.responses import Response

    from exactdraft.server.fields import RequestError
    from exactdraft.server.metrics import CONTENT_TYPE

    if call.shared.metrics is None:
        raise RequestError("/metrics needs prometheus_client: pip install prometheus_client",
                           None, 501, "api_error")
    return Response(call.shared.metrics.text(), media_type=CONTENT_TYPE)
