"""Running the server: a Generator, its Engine and prefix cache, and uvicorn on host:port.

Invariant: the prefix cache file, when one is named, is checked writable at start, read only if
it was written for this model (and, with a key, signed with it; otherwise ignored with a
warning, exactdraft.engine.cache_file) and is written back whole when the server shuts down
(also a tensor-parallel one on SIGTERM: its launcher stops rank 0 first), so a restarted server
starts warm with the same outputs.
When the engine stops after a failure (a dead or stuck tensor-parallel rank, a pass that
raised), the server logs the cause, answers 503 meanwhile, and shuts down failure_exit_s later;
`serve` then raises the EngineFailed, so the process exits non-zero and a supervisor restarts
it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from exactdraft.engine import (
    Engine,
    EngineFailed,
    PrefixCache,
    load_prefix_cache,
    save_prefix_cache,
)
from exactdraft.engine.cache_file import check_location
from exactdraft.errors import ExactdraftError
from exactdraft.generator import Generator
from exactdraft.models.target import capabilities_of


def build(generator: Generator, model_name: str, *, host: str = "127.0.0.1",
          port: int = 8000, max_sequences: int = 8, max_waiting: int = 64,
          prefix_cache_bytes: int | None = None, prefix_cache_file: str | None = None,
          prefix_cache_key: bytes | None = None,
          log_level: str = "warning", model_aliases: Mapping[str, str] | None = None,
          clamp_max_tokens: bool = False, failure_exit_s: float = 2.0,
          thinking_key: bytes | None = None) -> Any:
    """A uvicorn.Server for `generator` (not yet running: call its run(), from any thread;
    set should_exit to stop it). The engine stops, and the cache file is written, on
    shutdown. `prefix_cache_bytes`: the prefix cache's budget, 0 for none (None: a quarter of
    the available memory, 256 MiB to 8 GiB; exactdraft.engine.prefix_cache). `model_aliases`,
    `clamp_max_tokens`: see exactdraft.server.service.Service. `log_level` is uvicorn's; each
    request's line goes to the logger `exactdraft.server` instead of uvicorn's access log.
    `prefix_cache_file` is checked at once (CacheFileError if it cannot be written); with
    `prefix_cache_key` it is signed and read only when signed with that key. `failure_exit_s`:
    how long a server whose engine failed answers 503 (so a probe sees why) before it shuts
    down. `thinking_key` (bytes, at least 16) signs Anthropic thinking blocks; None: a random
    key for this server, so replicas that must accept each other's blocks share one."""
    import uvicorn

    from exactdraft.server.app import create_app
    from exactdraft.server.reasoning.signatures import checked_key_or_random
    from exactdraft.server.service import check_aliases

    check_aliases(model_name, model_aliases)  # before anything starts
    thinking_key = checked_key_or_random(thinking_key)
    cache = None if prefix_cache_bytes == 0 else PrefixCache(budget_bytes=prefix_cache_bytes)
    if cache is not None and prefix_cache_file is not None:
        check_location(prefix_cache_file)
        load_prefix_cache(cache, prefix_cache_file, generator.target, prefix_cache_key)
    server: Any = None

    def stop_failing(failure: EngineFailed) -> None:  # on the engine's thread
        cause = failure.__cause__
        # A traceback where the cause is not one of exactdraft's own reports (a bug, a
        # device error), whose message alone may not say where it came from.
        trace = None if cause is None or isinstance(cause, ExactdraftError) else \
            (type(cause), cause, cause.__traceback__)
        logging.getLogger("exactdraft.server").error(
            "%s; the server answers 503 and shuts down in %.1f s", failure, failure_exit_s,
            exc_info=trace)
        timer = threading.Timer(failure_exit_s, lambda: setattr(server, "should_exit", True))
        timer.daemon = True
        timer.start()

    engine = Engine(generator, max_sequences=max_sequences, max_waiting=max_waiting,
                    prefix_cache=cache, on_failure=stop_failing)

    def shut_down() -> None:
        engine.close()
        if engine.prefix_cache is not None and prefix_cache_file is not None:
            try:
                save_prefix_cache(engine.prefix_cache, prefix_cache_file, generator.target,
                                  prefix_cache_key)
            except OSError as error:  # checked at start; the folder changed since
                logging.getLogger("exactdraft.server").error(
                    "could not write the prefix cache file %s: %s", prefix_cache_file, error)
        if capabilities_of(generator.target).spans_ranks:
            # Now, not at exit: uvicorn ends the process by the signal that stopped it (the
            # launcher's SIGTERM), which runs no exit hook, and the other ranks must be told.
            generator.target.close()

    app = create_app(engine, model_name, on_shutdown=shut_down, model_aliases=model_aliases,
                     clamp_max_tokens=clamp_max_tokens, thinking_key=thinking_key)
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
    if server.engine.failure is not None:
        raise server.engine.failure


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
