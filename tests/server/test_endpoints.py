"""The endpoint table: the application serves exactly its rows, and an endpoint added as one
row (its handler in its own module) is served, with its refusals and failures in the wire
format the row names."""

from __future__ import annotations

import urllib.error
import urllib.request

import exactdraft.server.app as app_module
from exactdraft.server.context import Call
from exactdraft.server.endpoints import ENDPOINTS, Endpoint
from exactdraft.server.fields import RequestError
from tests.server.conftest import MODEL
from tests.server.live import get, post, server_in_thread


async def extra(call: Call):
    from starlette.responses import JSONResponse

    return JSONResponse({"served": call.shared.model_name, "path": call.request.url.path})


async def refusing(call: Call):
    raise RequestError("wanted a field", "field")


async def failing(call: Call):
    raise RuntimeError("broken on purpose")


ADDED = (Endpoint("GET", "/v1/extra", "tests.server.test_endpoints:extra"),
         Endpoint("POST", "/v1/refusing", "tests.server.test_endpoints:refusing", "anthropic"),
         Endpoint("POST", "/v1/failing", "tests.server.test_endpoints:failing"))


def status_of(base: str, path: str) -> int:
    try:
        with urllib.request.urlopen(base + path, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_application_serves_exactly_the_table(served_generator) -> None:
    from exactdraft.engine import Engine

    with Engine(served_generator, max_sequences=1) as engine:
        app = app_module.create_app(engine, MODEL)
    served = sorted((r.path, m) for r in app.routes for m in r.methods if m != "HEAD")
    assert served == sorted((e.path, e.method) for e in ENDPOINTS)


def test_an_endpoint_is_one_row(served_generator, monkeypatch) -> None:
    """With three rows added, each is served (and a refusal and a failure come back in the
    row's wire format); without them the same paths are 404."""
    monkeypatch.setattr(app_module, "ENDPOINTS", ENDPOINTS + ADDED)
    with server_in_thread(served_generator, MODEL) as (base, _):
        assert get(base, "/v1/extra") == {"served": MODEL, "path": "/v1/extra"}
        status, body = post(base, "/v1/refusing", {})
        assert status == 400 and body["type"] == "error"  # Anthropic's error shape
        assert body["error"]["param"] == "field"
        status, body = post(base, "/v1/failing", {})
        assert status == 500 and "broken on purpose" in body["error"]["message"]
        assert "type" not in body  # OpenAI's error shape
        assert status_of(base, "/health") == 200
    monkeypatch.setattr(app_module, "ENDPOINTS", ENDPOINTS)
    with server_in_thread(served_generator, MODEL) as (base, _):
        assert status_of(base, "/v1/extra") == 404
