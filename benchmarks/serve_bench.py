"""Serving benchmark: concurrent streams, the prefix cache and the HTTP server, each checked exact.

    python benchmarks/serve_bench.py                     # bundled SmolLM2, 8 streams, 48 tokens
    python benchmarks/serve_bench.py --streams 4 --tokens 16 --prefix-tokens 200 --skip-server
    python benchmarks/serve_bench.py --llama-python /opt/llama-venv/bin/python

One process, `--threads` threads (torch and exactdraft's C kernels), the model loaded once
(default: the bundled SmolLM2 with its quantized blocks kept; `--model PATH` for another).

1. Concurrency: `--streams` requests (distinct chat prompts and seeds, temperature 0.7, exactly
   `--tokens` new tokens) run together through exactdraft.engine.Engine, against each run alone
   with Generator.generate: aggregate decode tokens/s over single-stream decode tokens/s (decode
   time is the library's own per-sequence clock; end-to-end figures are reported too), and
   whether every output equals its solo run. `--concurrency-rounds` rounds, each alone then
   together, the ratio the median of the rounds' ratios (a noisy machine moves both alike).
2. Prefix cache: a `--prefix-tokens` document as the system message, then a short question:
   time to first token (submit to first chunk) with the document's blocks in a PrefixCache
   against a cold prefill, and whether the output with a hit equals the cold output.
3. Server: one streamed /v1/chat/completions request through the HTTP server (in a thread of
   this process, no prefix cache) against Generator.stream for the same request, on the
   caller's clock: tokens/s from the call to the last chunk (the ratio), decode tokens/s (first
   to last chunk) and time to first token, and whether texts and tokens are equal.
4. llama.cpp, only with `--llama-python` (an interpreter with llama-cpp-python) on a GGUF model:
   its high-level Llama class runs one sequence at a time, so this script drives its low-level
   batch API in a subprocess (llama.cpp's `batched` example): the same requests prefilled one by
   one, then decoded together in one llama_decode per step (one sequence per slot), against each
   decoded alone; its decode tokens/s ratio and whether concurrent outputs equal solo outputs.
5. Servers side by side, also only with `--llama-python`: exactdraft's server and llama.cpp's
   (llama-cpp-python[server]) answer the same `--streams` non-streamed chat requests, solo and
   all at once (server_peers.py): each one's throughput, concurrent over solo, whether its
   concurrent replies equal its solo ones, and the two servers' throughput ratio.

Medians of `--repeats` runs for part 2 and `--server-repeats` for part 3 (the server and the
API alternating, so that a noisy machine's load falls on both alike). Prints the SIMD level,
the command and every figure; writes serve_bench.json to `--out`. Exits 1 when an output
differed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import resolve_model, use_threads  # noqa: E402
from server_peers import exactdraft_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "Explain how a hash map works and when lookups get slow.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the main differences between TCP and UDP?",
    "Give me three tips for learning to play the guitar as an adult.",
    "Describe the water cycle to a ten-year-old.",
    "How does a bicycle stay upright while moving?",
    "List some good habits for writing maintainable Python code.",
    "Why is the sky blue during the day and red at sunset?",
]
PREFIX_QUESTIONS = ["Summarize the document above in two sentences.",
                    "What problem does this project solve?",
                    "Name one command the document shows.",
                    "Who is this document written for?"]


def chat(question: str, system: str | None = None) -> list[dict]:
    head = [{"role": "system", "content": system}] if system else []
    return head + [{"role": "user", "content": question}]


def requests(streams: int) -> list[tuple[list[dict], int]]:
    """(messages, seed) of each stream: distinct prompts and seeds."""
    return [(chat(QUESTIONS[i % 8] + (f" (take {i // 8 + 1})" if i >= 8 else "")), 1000 + i)
            for i in range(streams)]


def per_second(tokens: int, seconds: float) -> float | None:
    return tokens / seconds if tokens > 0 and seconds > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def concurrency(generator, args) -> dict:
    """`--concurrency-rounds` rounds, each the streams alone and then together, so that a
    noisy machine's load falls on both alike; the ratio is the median of the rounds'."""
    from exactdraft.engine import Engine

    options = dict(max_new_tokens=args.tokens, temperature=0.7, stop_tokens=[])
    rounds, identical, per_pass = [], [], []
    for _ in range(args.concurrency_rounds):
        solo = [generator.generate(m, seed=s, **options) for m, s in requests(args.streams)]
        with Engine(generator, max_sequences=args.streams) as engine:
            started = time.perf_counter()
            submissions = [engine.submit(m, seed=s, **options)
                           for m, s in requests(args.streams)]
            together = [s.results()[0] for s in submissions]
            wall = time.perf_counter() - started
            per_pass += engine.stats.sequences_per_pass
        single = statistics.median(r.stats.tokens_per_second for r in solo)
        aggregate = per_second(sum(len(r.tokens) - 1 for r in together),
                               max(r.stats.decode_seconds for r in together))
        single_wall = per_second(sum(len(r.tokens) for r in solo),
                                 sum(r.stats.wall_seconds for r in solo))
        aggregate_wall = per_second(sum(len(r.tokens) for r in together), wall)
        rounds.append((single, aggregate, single_wall, aggregate_wall))
        identical += [a.tokens == b.tokens for a, b in zip(together, solo)]
    single, aggregate, single_wall, aggregate_wall = (statistics.median(column)
                                                      for column in zip(*rounds))
    return {"streams": args.streams, "tokens": args.tokens, "rounds": len(rounds),
            "single_decode_tokens_per_second": single,
            "aggregate_decode_tokens_per_second": aggregate,
            "ratio": statistics.median(ratio(a, s) or 0.0 for s, a, _, _ in rounds),
            "round_ratios": [round(ratio(a, s) or 0.0, 3) for s, a, _, _ in rounds],
            "single_wall_tokens_per_second": single_wall,
            "aggregate_wall_tokens_per_second": aggregate_wall,
            "wall_ratio": statistics.median(ratio(a, s) or 0.0 for _, _, s, a in rounds),
            "mean_sequences_per_pass": statistics.mean(per_pass) if per_pass else None,
            "identical": identical, "all_identical": all(identical)}


def document(tokenizer, tokens: int) -> str:
    """About `tokens` tokens of the README (repeated if shorter), as text."""
    text = (ROOT / "README.md").read_text()
    ids = tokenizer.encode(text, add_special_tokens=False)
    ids = (ids * (tokens // max(len(ids), 1) + 1))[:tokens]
    return tokenizer.decode(ids)


def first_token(engine, prompt, options: dict):
    """(seconds from submit to the first chunk with a token, the result)."""
    started = time.perf_counter()
    submission = engine.submit(prompt, **options)
    first = None
    for _, chunk in submission.events():
        if first is None and chunk.tokens:
            first = time.perf_counter() - started
    return first, submission.results()[0]


def prefix_cache(generator, args) -> dict:
    from exactdraft.engine import Engine, PrefixCache
    from exactdraft.prompts import encode_prompt

    system = document(generator.tokenizer, args.prefix_tokens)
    options = dict(max_new_tokens=min(args.tokens, 16), temperature=0.7, seed=7, stop_tokens=[])
    prompts = [chat(q, system) for q in PREFIX_QUESTIONS[:args.repeats + 1]]
    ids = [encode_prompt(p, generator.tokenizer, generator.target.vocab_size) for p in prompts]
    shared = next((i for i, (a, b) in enumerate(zip(*ids[:2])) if a != b), len(ids[0]))
    cache = PrefixCache()
    runs = []
    with Engine(generator, prefix_cache=cache) as warm, Engine(generator) as cold:
        first_token(warm, prompts[0], options)  # stores the document's blocks
        before = cache.stats.hit_tokens
        for prompt in prompts[1:]:
            cold_seconds, cold_result = first_token(cold, prompt, options)
            hit_seconds, hit_result = first_token(warm, prompt, options)
            alone = generator.generate(prompt, **options)
            runs.append({"cold_ms": 1000 * cold_seconds, "hit_ms": 1000 * hit_seconds,
                         "identical": hit_result.tokens == cold_result.tokens == alone.tokens})
        hit_tokens = (cache.stats.hit_tokens - before) // len(runs)
    cold_ms = statistics.median(r["cold_ms"] for r in runs)
    hit_ms = statistics.median(r["hit_ms"] for r in runs)
    return {"shared_prefix_tokens": shared, "prompt_tokens": len(ids[1]), "hit_tokens": hit_tokens,
            "cold_first_token_ms": cold_ms, "hit_first_token_ms": hit_ms,
            "ratio": ratio(cold_ms, hit_ms), "runs": runs,
            "all_identical": all(r["identical"] for r in runs)}


def stream_over_http(base: str, body: dict) -> tuple[float, float, str, dict]:
    """(seconds to the first chunk, seconds from it to the last, text, receipt)."""
    request = urllib.request.Request(base + "/v1/chat/completions",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    started = time.perf_counter()
    first = last = None
    text, receipt = "", {}
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            choices = json.loads(line[6:])["choices"]
            if not choices:
                continue
            last = time.perf_counter()
            first = first or last
            text += choices[0]["delta"].get("content") or ""
            receipt = choices[0].get("receipt") or receipt
    return first - started, last - first, text, receipt


def stream_in_python(generator, messages: list[dict], options: dict):
    started = time.perf_counter()
    first = last = None
    stream = generator.stream(messages, **options)
    for _ in stream:
        last = time.perf_counter()
        first = first or last
    return first - started, last - first, stream.result


def server(generator, args) -> dict:
    try:
        from exactdraft.results import token_digest
    except ImportError as error:
        return {"skipped": f"the server extra is not installed ({error})"}
    messages, seed = requests(1)[0]
    body = {"messages": messages, "max_tokens": args.tokens, "temperature": 0.7, "seed": seed,
            "stream": True}
    api, http, same_text, same_tokens = [], [], [], []
    try:
        with exactdraft_server(generator, 8) as base:
            for _ in range(args.server_repeats):
                first, decode, text, receipt = stream_over_http(base, body)
                n = receipt.get("completion_tokens", 0)
                http.append((n / (first + decode), per_second(n - 1, decode), first))
                first, decode, result = stream_in_python(
                    generator, messages,
                    dict(max_new_tokens=args.tokens, temperature=0.7, seed=seed))
                api.append((len(result.tokens) / (first + decode),
                            per_second(len(result.tokens) - 1, decode), first))
                same_text.append(text == result.text)
                same_tokens.append(receipt.get("token_ids_sha256") == token_digest(result.tokens))
    except ImportError as error:
        return {"skipped": f"the server extra is not installed ({error})"}
    except RuntimeError as error:
        return {"skipped": str(error)}
    figures = {"tokens": n}
    for side, runs in (("api", api), ("server", http)):
        figures[f"{side}_tokens_per_second"] = statistics.median(r for r, _, _ in runs)
        figures[f"{side}_decode_tokens_per_second"] = statistics.median(
            r or 0.0 for _, r, _ in runs) or None
        figures[f"{side}_first_token_ms"] = 1000 * statistics.median(f for _, _, f in runs)
    return {**figures, "ratio": ratio(figures["server_tokens_per_second"],
                                      figures["api_tokens_per_second"]),
            "decode_ratio": ratio(figures["server_decode_tokens_per_second"],
                                  figures["api_decode_tokens_per_second"]),
            "texts_equal": all(same_text), "tokens_equal": all(same_tokens),
            "all_identical": all(same_text) and all(same_tokens)}


def llama_worker(spec: dict) -> dict:
    """Run in the llama-cpp-python interpreter: concurrent vs solo decoding, low-level API."""
    import llama_cpp as lc

    threads, tokens = spec["threads"], spec["tokens"]
    llm = lc.Llama(model_path=spec["model"], n_ctx=256, n_threads=threads,
                   n_threads_batch=threads, verbose=False)
    prompts = [llm.tokenize(p.encode(), add_bos=False, special=True) for p in spec["prompts"]]
    params = lc.llama_context_default_params()
    params.n_seq_max = len(prompts)
    per_sequence = -(-(max(map(len, prompts)) + tokens) // 256) * 256
    params.n_ctx = len(prompts) * per_sequence
    params.n_threads = params.n_threads_batch = threads
    ctx = lc.llama_init_from_model(llm.model, params)
    batch = lc.llama_batch_init(max(512, len(prompts)), 0, 1)

    def decode(rows: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(rows)
        for j, (token, position, sequence, logits) in enumerate(rows):
            batch.token[j], batch.pos[j], batch.logits[j] = token, position, logits
            batch.n_seq_id[j], batch.seq_id[j][0] = 1, sequence
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def run(group: list[int]) -> tuple[dict, float]:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        samplers, out = [], {i: [] for i in group}
        for slot, i in enumerate(group):
            chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(0.7))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(spec["seeds"][i]))
            samplers.append(chain)
            ids = prompts[i]
            decode([(t, p, slot, p == len(ids) - 1) for p, t in enumerate(ids)])
            out[i].append(lc.llama_sampler_sample(chain, ctx, len(ids) - 1))
        started = time.perf_counter()
        for step in range(tokens - 1):
            decode([(out[i][-1], len(prompts[i]) + step, slot, True)
                    for slot, i in enumerate(group)])
            for slot, i in enumerate(group):
                out[i].append(lc.llama_sampler_sample(samplers[slot], ctx, slot))
        seconds = time.perf_counter() - started
        for chain in samplers:
            lc.llama_sampler_free(chain)
        return out, seconds

    everyone = list(range(len(prompts)))
    together, seconds = run(everyone)
    solo = [run([i]) for i in everyone]
    single = statistics.median((tokens - 1) / s for _, s in solo)
    aggregate = len(prompts) * (tokens - 1) / seconds
    identical = [together[i] == solo[i][0][i] for i in everyone]
    return {"version": lc.__version__, "streams": len(prompts), "tokens": tokens,
            "single_decode_tokens_per_second": single,
            "aggregate_decode_tokens_per_second": aggregate, "ratio": aggregate / single,
            "identical": identical, "all_identical": all(identical)}


def llama_cpp(generator, model: str | None, args) -> dict:
    if not args.llama_python:
        return {"skipped": "no --llama-python given"}
    if not model or not model.endswith(".gguf"):
        return {"skipped": f"llama.cpp needs a GGUF model, not {model}"}
    render = generator.tokenizer.render_chat
    spec = {"model": model, "threads": args.threads, "tokens": args.tokens,
            "prompts": [render(m) for m, _ in requests(args.streams)],
            "seeds": [s for _, s in requests(args.streams)]}
    done = subprocess.run([args.llama_python, __file__, "--llama-worker", json.dumps(spec)],
                          capture_output=True, text=True, cwd="/")
    if done.returncode:
        return {"skipped": f"the llama.cpp worker failed: {done.stderr.strip()[-1500:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def servers(generator, model: str | None, args) -> dict:
    if not args.llama_python or args.skip_server:
        return {"skipped": "no --llama-python given" if not args.llama_python else "--skip-server"}
    if not model or not model.endswith(".gguf"):
        return {"skipped": f"llama.cpp needs a GGUF model, not {model}"}
    try:
        import exactdraft.server  # noqa: F401
    except ImportError as error:
        return {"skipped": f"the server extra is not installed ({error})"}
    from server_peers import compare

    try:
        return compare(generator, model, args.llama_python, args.threads,
                       requests(args.streams), args.tokens)
    except RuntimeError as error:
        return {"skipped": str(error)}


def show(name: str, part: dict, indent: str = "") -> None:
    if "skipped" in part:
        print(f"{indent}{name}: skipped: {part['skipped']}")
        return
    print(f"{indent}{name}:")
    for key, value in part.items():
        if isinstance(value, dict):
            show(key, value, indent + "  ")
        elif key not in ("runs", "identical"):
            print(f"{indent}  {key}: {f'{value:.3f}' if isinstance(value, float) else value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint path (default: bundled)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prefix-tokens", type=int, default=1000)
    parser.add_argument("--concurrency-rounds", type=int, default=3,
                        help="rounds of part 1, each the streams alone, then together")
    parser.add_argument("--repeats", type=int, default=3, help="runs of part 2 (max 3)")
    parser.add_argument("--server-repeats", type=int, default=7, help="runs of part 3")
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--llama-python", default=None,
                        help="a Python with llama-cpp-python, for the llama.cpp comparison")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--llama-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_worker:
        print(json.dumps(llama_worker(json.loads(args.llama_worker))))
        return 0
    args.repeats = max(1, min(args.repeats, len(PREFIX_QUESTIONS) - 1))
    args.server_repeats = max(1, args.server_repeats)
    args.concurrency_rounds = max(1, args.concurrency_rounds)
    command = "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    import exactdraft as xd

    info = use_threads(args.threads, command)
    generator = xd.Generator.from_pretrained(args.model, progress=False)
    generator.generate(chat(QUESTIONS[0]), max_new_tokens=4, seed=0)  # warm-up
    report = {"command": command, "machine": info, "model": args.model or "bundled SmolLM2"}
    for name, measure in (("concurrency", concurrency), ("prefix_cache", prefix_cache)):
        print(f"running {name} ...", file=sys.stderr)
        report[name] = measure(generator, args)
        show(name, report[name])
    report["server"] = {"skipped": "--skip-server"} if args.skip_server else \
        server(generator, args)
    show("server", report["server"])
    report["llama_cpp"] = llama_cpp(generator, resolve_model(args.model), args)
    show("llama_cpp", report["llama_cpp"])
    print("running servers ...", file=sys.stderr)
    report["servers"] = servers(generator, resolve_model(args.model), args)
    show("servers", report["servers"])
    ours = [report[k] for k in ("concurrency", "prefix_cache", "server")] + \
        [report["servers"].get("exactdraft", {})]
    exact = [part["all_identical"] for part in ours if "all_identical" in part]
    report["all_identical"] = all(exact)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_bench.json").write_text(json.dumps(report, indent=1))
    print(f"every exactdraft output identical: {report['all_identical']}\n"
          f"report: {out / 'serve_bench.json'}")
    return 0 if report["all_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
