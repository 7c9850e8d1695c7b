"""An OpenAI- and Anthropic-compatible HTTP server over the engine (`pip install -e
".[server]"` in a checkout; `exactdraft serve`). Every response carries a receipt so a client can
check drafted == serial itself, and two processes of the same model under the same arithmetic
give the same bytes for the same request (only `id` and `created` differ, and a thinking
block's signature unless they share a thinking key). The endpoints are
the rows of endpoints.ENDPOINTS, each handled in its API family's module; /metrics speaks
Prometheus (metrics.py) and each request is logged on `exactdraft.server` (context.py)."""

from exactdraft.server.run import bound_address, build, serve

__all__ = ["bound_address", "build", "serve"]
