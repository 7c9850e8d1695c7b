"""Endpoints for operating the server: /health and /metrics (Prometheus text, metrics.py).

Invariant: they read the engine's state and change nothing. /health answers 200 while the
engine serves and 503 naming the cause (a dead or stuck tensor-parallel rank, a pass that
raised) from the moment it has stopped after a failure.
"""

from __future__ import annotations

from typing import Any

from exactdraft.server.context import Call


async def health(call: Call) -> Any:
    from starlette.responses import JSONResponse

    engine = call.shared.engine
    running, waiting = engine.load
    state = {"status": "ok", "model": call.shared.model_name, "running": running,
             "waiting": waiting, "max_sequences": engine.max_sequences,
             "max_waiting": engine.max_waiting, "cancelled": engine.stats.cancelled}
    if engine.failure is not None:
        return JSONResponse({**state, "status": "failed", "error": str(engine.failure)},
                            status_code=503)
    return JSONResponse(state)


async def metrics(call: Call) -> Any:
    from starlette.responses import Response

    from exactdraft.server.fields import RequestError
    from exactdraft.server.metrics import CONTENT_TYPE

    if call.shared.metrics is None:
        raise RequestError("/metrics needs prometheus_client: pip install prometheus_client",
                           None, 501, "api_error")
    return Response(call.shared.metrics.text(), media_type=CONTENT_TYPE)
