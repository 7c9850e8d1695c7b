"""exactdraft's HTTP server as a Ray Serve deployment: replicas behind Ray Serve's proxy.

    serve run examples.ray_serve_app:build model=PATH replicas=2 backend=torch
    python examples/ray_serve_app.py [MODEL] --replicas 2 --port 8000

Each replica is its own Ray actor process that loads the model and serves it with its own
Engine and prefix cache, through the same application `exactdraft serve` runs (every endpoint,
/metrics included, so a router can read each replica's load). Replicas of one checkpoint under
the same arithmetic answer a request with the same body apart from `id` and `created`; under
adaptive depth (the default) the receipts' drafted and accepted counts may differ too, as
between any two processes (`adaptive_depth=false` removes that). Each response carries an
`x-exactdraft-replica` header naming the replica that answered. The replicas of one deployment
sign Anthropic thinking blocks with one key (made when the deployment is built, or read from
`thinking_key_file=PATH`), so each catches a change to the blocks another signed.
(Needs `pip install "ray[serve]"` and the server extra.)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ray import serve

MODEL_NAME = "exactdraft"


@serve.deployment(name="exactdraft")
@serve.ingress()
class ExactdraftReplica:
    """One replica: a Generator, its Engine, and exactdraft's ASGI application."""

    def __init__(self, model: str | None, backend: str | None = None,
                 model_name: str = MODEL_NAME, drafter: str = "lookup",
                 adaptive_depth: bool = True, max_sequences: int = 8,
                 thinking_key: bytes | None = None) -> None:
        import exactdraft as xd
        from exactdraft.engine import Engine, PrefixCache

        drafters = {"lookup": xd.PromptLookup, "suffix": xd.SuffixDrafter,
                    "none": lambda: None}
        self.generator = xd.Generator.from_pretrained(
            model, backend, drafter=drafters[drafter](), adaptive_depth=adaptive_depth,
            progress=False)
        self.engine = Engine(self.generator, max_sequences=max_sequences,
                             prefix_cache=PrefixCache())
        self.model_name = model_name
        self.thinking_key = thinking_key

    def __serve_build_asgi_app__(self) -> Any:
        from exactdraft.server.app import create_app

        app = create_app(self.engine, self.model_name, on_shutdown=self.engine.close,
                         thinking_key=self.thinking_key)
        replica = serve.get_replica_context().replica_id.unique_id.encode()

        async def named(scope: Any, receive: Any, send: Any) -> None:
            async def send_named(message: dict) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []),
                                                      (b"x-exactdraft-replica", replica)]}
                await send(message)

            await app(scope, receive, send_named if scope["type"] == "http" else send)

        return named


def build(args: dict[str, str]) -> Any:
    """The application `serve run examples.ray_serve_app:build key=value ...` deploys: keys
    model, backend, model_name, drafter (lookup, suffix, none), adaptive_depth, replicas,
    cpus (per replica), thinking_key_file (default: a random key, the same for every
    replica)."""
    from exactdraft.server.reasoning.signatures import checked_key_or_random, read_thinking_key

    replicas = int(args.get("replicas", 2))
    options = {"num_cpus": float(args.get("cpus", 1))}
    key_file = args.get("thinking_key_file")
    key = checked_key_or_random(None) if key_file is None else read_thinking_key(key_file)
    return ExactdraftReplica.options(num_replicas=replicas, ray_actor_options=options).bind(
        args.get("model"), args.get("backend"), args.get("model_name", MODEL_NAME),
        args.get("drafter", "lookup"), args.get("adaptive_depth", "true").lower() == "true",
        thinking_key=key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None, help="checkpoint (default: SmolLM2)")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--cpus", type=float, default=1, help="CPUs per replica")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build({"model": args.model, "backend": args.backend,
                     "replicas": str(args.replicas), "cpus": str(args.cpus)}),
              route_prefix="/")
    print(f"serving on http://{args.host}:{args.port} with {args.replicas} replicas",
          flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
