"""The cost of one draft-head guess's draw, the full banned row against `sample_among`, in one
process, alternating:

    python benchmarks/head_draw.py [--rounds 7]

The head's logits over its draft vocabulary are stood in for by the bundled SmolLM2's logits at
the draft ids of the bundled head (after prompts of 1, 16 and 100 tokens). "full row" scatters
them into the 49152-token row (every other token banned) and calls `KeyedSampler.sample`, what
the head did before; "among top 64" cuts them as the head does (`most_probable`: the 64 most
probable) and calls `sample_among`; "among all" passes the whole draft vocabulary to `sample_among`.
First every way must draw the same token at 64 positions of every row (greedy and T=0.7); then
per way the best of `--rounds` rounds of 200 draws, in microseconds. Exits 1 if tokens differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from cpu_bench import machine  # noqa: E402
from draw_ab import logits_rows  # noqa: E402

from exactdraft.drafters.head import DraftHead, most_probable  # noqa: E402


def ways(sampler, draft_ids: np.ndarray, vocab: int):
    def full_row(values, params, pos):
        row = np.full(vocab, -1e9, dtype=np.float32)
        row[draft_ids] = values
        return sampler.sample(row, params, pos=pos)

    def among_top(values, params, pos):
        top = most_probable(values)
        return sampler.sample_among(values[top], draft_ids[top], vocab, params, pos=pos)

    def among_all(values, params, pos):
        return sampler.sample_among(values, draft_ids, vocab, params, pos=pos)

    return {"full row": full_row, "among top 64": among_top, "among all": among_all}


def main() -> int:
    import exactdraft as xd

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    info = machine()
    print(f"$ python benchmarks/head_draw.py --rounds {args.rounds}")
    print(f"{info['cpu']}, {info['cpus']} CPUs, SIMD level {info['simd_level']}")
    target = xd.Generator.from_pretrained(None, progress=False).target
    draft_ids = DraftHead.from_pretrained(None, target).draft_ids
    rows = [row[draft_ids] for row in logits_rows(None)]
    sampler = xd.KeyedSampler()
    candidates = ways(sampler, draft_ids, target.vocab_size)
    print(json.dumps({"vocab": target.vocab_size, "draft_vocab": int(draft_ids.size),
                      "native": bool(sampler.native)}))
    identical = True
    for temperature in (0.0, 0.7):
        params = xd.SamplingParams(temperature=temperature, seed=1234)
        # At T=0.7 the cut to the top 64 may draw another token than the full draft vocabulary
        # (a token outside the top 64 can win the noise); it must match at T=0 and "among all"
        # must match everywhere.
        checked = candidates if temperature == 0 else {k: v for k, v in candidates.items()
                                                       if k != "among top 64"}
        for row in rows:
            for pos in range(64):
                drawn = {name: way(row, params, pos) for name, way in checked.items()}
                identical &= len(set(drawn.values())) == 1
        best = dict.fromkeys(candidates, float("inf"))
        for _ in range(args.rounds):
            for name, way in candidates.items():
                started = time.perf_counter()
                for i in range(200):
                    way(rows[i % len(rows)], params, i)
                best[name] = min(best[name], (time.perf_counter() - started) / 200)
        print(json.dumps({"temperature": temperature,
                          **{f"{name} us": round(t * 1e6, 1) for name, t in best.items()}}))
    print(json.dumps({"same_tokens": identical}))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
