"""Running the server: a Generator, its Engine and prefix cache, and uvicorn on host:port.

Invariant: the prefix cache file, when one is named, is read only if it was written for this
model (otherwise ignored with a warning, exactdraft.engine.cache_file) and is written back
whole when the server shuts down, so a restarted server starts warm with the same outputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from exactdraft.engine import Engine, PrefixCache, load_prefix_cache, save_prefix_cache
from exactdraft.generator import Generator


def build(generator: Generator, model_name: str, *, host: str = "127.0.0.1",
          port: int = 8000, max_sequences: int = 8, max_waiting: int = 64,
          prefix_cache_bytes: int | None = None, prefix_cache_file: str | None = None,
          log_level: str = "warning", model_aliases: Mapping[str, str] | None = None,
          clamp_max_tokens: bool = False) -> Any:
    """A uvicorn.Server for `generator` (not yet running: call its run(), from any thread;
    set should_exit to stop it). The engine stops, and the cache file is written, on
    shutdown. `prefix_cache_bytes`: the prefix cache's budget, 0 for none (None: a quarter of
    the available memory, 256 MiB to 8 GiB; exactdraft.engine.prefix_cache). `model_aliases`,
    `clamp_max_tokens`: see exactdraft.server.service.Service. `log_level` is uvicorn's; each
    request's line goes to the logger `exactdraft.server` instead of uvicorn's access log."""
    import uvicorn

    from exactdraft.server.app import create_app
    from exactdraft.server.service import check_aliases

    check_aliases(model_name, model_aliases)  # before anything starts
    cache = None if prefix_cache_bytes == 0 else PrefixCache(budget_bytes=prefix_cache_bytes)
    if cache is not None and prefix_cache_file is not None:
        load_prefix_cache(cache, prefix_cache_file, generator.target)
    engine = Engine(generator, max_sequences=max_sequences, max_waiting=max_waiting,
                    prefix_cache=cache)

    def shut_down() -> None:
        engine.close()
        if engine.prefix_cache is not None and prefix_cache_file is not None:
            save_prefix_cache(engine.prefix_cache, prefix_cache_file, generator.target)

    app = create_app(engine, model_name, on_shutdown=shut_down, model_aliases=model_aliases,
                     clamp_max_tokens=clamp_max_tokens)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                           access_log=False))
    server.engine = engine
    return server


def bound_address(server: Any) -> tuple[str, int]:
    """(host, port) a started server listens on (the chosen one for port 0)."""
    return tuple(server.servers[0].sockets[0].getsockname()[:2])


def serve(generator: Generator, model_name: str, *,
          ready: Callable[[tuple[str, int]], None] | None = None, **options: Any) -> None:
    """Serve `generator` until interrupted (options: those of `build`). `ready` is called with
    the bound (host, port) once the server accepts connections. With `log_level`, the logger
    `exactdraft.server` logs at that level (on stderr, unless logging is configured
    already): one line per request at "info"."""
    if "log_level" in options:
        configure_logging(options["log_level"])
    server = build(generator, model_name, **options)
    if ready is not None:
        original = server.startup

        async def startup(sockets: Any = None) -> None:
            await original(sockets=sockets)
            if server.started:
                ready(bound_address(server))

        server.startup = startup
    server.run()


def configure_logging(level: str) -> None:
    """The request log at `level` ("debug", "info", "warning", "error"), on stderr unless the
    process has configured logging itself."""
    logger = logging.getLogger("exactdraft.server")
    logger.setLevel(level.upper())
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s"))
        logger.addHandler(handler)
