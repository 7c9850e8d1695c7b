"""What one draft step of the head costs against the target's one-row step, by draft vocabulary.

    python benchmarks/draft_cost.py [--model GGUF --head FOLDER] [--sizes 2048,4096,8192,...]
                                    [--context 256] [--repeats 30] [--threads 2] [--tokens 128]

For the bundled SmolLM2 (or --model; quantized blocks kept) and a head for it (default: the
bundled one), the median time of a one-row target step and of a (1 + max_draft)-row verify
pass at `context` positions, and for each draft vocabulary size N the median time of one
draft step: one head row, its logits over N target output rows, and the keyed draw (at T=0.7,
the candidates' cut included).
A head's own weights do not depend on N (only which output rows it multiplies), so each size
reuses the head's block with the N most frequent ids of its vocabulary where N is smaller, or
its vocabulary plus the most frequent other ids where N is larger; frequent as counted in the
target's greedy replies to the first --frequency-prompts training prompts. For each size, the
share of the target's greedy tokens on head_acceptance.py's chat prompts inside the vocabulary
(what a head with it could keep at most); --save-heads DIR writes each resized head there
(DIR/vocab-N) for head_acceptance.py to count its drafts kept. The draft step is timed as the
marginal cost of a guess: (propose 4 guesses - propose 1 guess) / 3, the head's rows of the
committed sequence already computed, as in decoding. Medians, and the ratio of the fastest
repeats (what load adds only slows a repeat down, so minima move least on a shared machine).
Then, unless --tokens 0, a decode on head_acceptance.py's chat prompts splits each drafted
pass's time into the head's part and the rest. Run on a quiet machine; the figures are times,
so load moves them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import machine  # noqa: E402
from head_acceptance import PROMPTS, as_prompt, bundled_target  # noqa: E402
from verify_cost import pass_costs  # noqa: E402


def frequency_order(generator, prompt_count: int, tokens: int) -> np.ndarray:
    """Every target id, most frequent first (ties: the lower id), in the target's greedy
    replies to the first `prompt_count` training prompts (train-drafter's corpus, small)."""
    from exactdraft.training import corpus

    settings = {"temperatures": (0.0,), "samples": 1, "seed": 0, "max_new_tokens": tokens,
                "generation_batch": 8}
    prompts = corpus.read_prompts()[:prompt_count]
    examples = corpus.generate_corpus(generator, prompts, settings, lambda *line: None)
    vocab_size = generator.target.vocab_size
    counts = np.zeros(vocab_size, dtype=np.int64)
    for example in examples:
        np.add.at(counts, np.asarray(example.tokens[example.n_prompt:], dtype=np.int64), 1)
    return np.lexsort((np.arange(vocab_size), -counts))


def resized(weights, size: int, order: np.ndarray):
    """The head's weights with a draft vocabulary of `size` ids: the most frequent (`order`)
    of its own where `size` is smaller, else its own and the most frequent others."""
    from exactdraft.drafters.head_model import HeadWeights

    ids = weights.tensors["draft_ids"]
    own = np.isin(order, ids)
    if size <= len(ids):
        chosen = np.sort(order[own][:size])
    else:
        chosen = np.union1d(ids, order[~own][:size - len(ids)])
    config = dataclasses.replace(weights.config, draft_vocab_size=len(chosen))
    return HeadWeights(config, {**weights.tensors, "draft_ids": chosen.astype(np.int64)})


def coverage(generator, vocabularies: dict[int, np.ndarray], tokens: int) -> dict[int, float]:
    """The share of the target's greedy reply tokens on the chat prompts (none of them
    training prompts) inside each draft vocabulary: the most a head with it could keep."""
    written = np.concatenate([generator.generate(as_prompt(generator.tokenizer, prompt),
                                                 max_new_tokens=tokens, temperature=0.0,
                                                 stop_tokens=[]).tokens for prompt in PROMPTS])
    return {size: float(np.isin(written, ids).mean()) for size, ids in vocabularies.items()}


def draft_step_costs(heads: dict[int, object], target, context: int, repeats: int
                     ) -> dict[int, dict[str, float]]:
    """Per head: median seconds of proposing 1 and 4 guesses after `context` committed tokens
    (the heads and counts interleaved, so drifting load hits them alike), and the marginal
    cost of one guess."""
    import exactdraft as xd
    from exactdraft.guard import probe_tokens

    sequence = probe_tokens(context, target.vocab_size, salt=11)
    params = xd.SamplingParams(temperature=0.7, seed=1)
    features = target.forward(target.new_state(), sequence[:-1], features=True)[1]
    for head in heads.values():
        head.begin(sequence, xd.DraftContext(params=params, sampler=xd.KeyedSampler(),
                                             n_prompt=len(sequence)))
        head.observe(features, 0)
        head.propose(sequence, 4)  # the catch-up rows, once
    times = {(size, count): [] for size in heads for count in (1, 4)}
    for _ in range(repeats):
        for (size, count), values in times.items():
            started = time.perf_counter()
            heads[size].propose(sequence, count)
            values.append(time.perf_counter() - started)
    costs = {}
    for size in heads:
        one, four = (statistics.median(times[size, count]) for count in (1, 4))
        fastest_one, fastest_four = (min(times[size, count]) for count in (1, 4))
        costs[size] = {"propose_1": one, "propose_4": four, "draft_step": (four - one) / 3,
                       "fastest_draft_step": (fastest_four - fastest_one) / 3}
    return costs


def head_costs(heads: dict[int, object], target, context: int, repeats: int,
               max_draft: int = 4) -> list[dict]:
    """Each head's draft step next to the target's one-row step and its verify pass of the
    last committed token and max_draft drafts."""
    verify = 1 + max_draft
    passes = pass_costs(target, context, repeats, widths=(1, verify))
    fastest = pass_costs(target, context, repeats, widths=(1,), statistic=min)[1]
    drafts = draft_step_costs(heads, target, context, repeats)
    step = passes[1]
    return [{"draft_vocab": size, "step_ms": round(step * 1e3, 3),
             f"verify_{verify}_rows_ms": round(passes[verify] * 1e3, 3),
             "draft_step_ms": round(cost["draft_step"] * 1e3, 3),
             "draft_step_over_step": round(cost["draft_step"] / step, 3),
             "four_drafts_over_step": round(cost["propose_4"] / step, 3),
             "fastest_draft_step_over_fastest_step": round(cost["fastest_draft_step"] / fastest,
                                                           3)}
            for size, cost in drafts.items()]


def decode_breakdown(target, tokenizer, head, prompts: list[str], tokens: int) -> list[dict]:
    """Per temperature, a drafted run's decode time per target pass split into the head's
    work (propose: catch-up rows and guesses; observe: taking the pass's features) and the
    rest (the target's verify pass and the generator's own work), next to the serial run's
    time per step; tokens per pass and every output checked against serial."""
    import exactdraft as xd

    spent = {"propose": 0.0, "observe": 0.0}
    for name in spent:
        method = getattr(head, name)

        def timed(*args, _method=method, _name=name):
            started = time.perf_counter()
            try:
                return _method(*args)
            finally:
                spent[_name] += time.perf_counter() - started

        setattr(head, name, timed)
    drafted = xd.Generator(target, head, tokenizer=tokenizer, adaptive_depth=False)
    serial = xd.Generator(target, tokenizer=tokenizer)
    records = []
    for temperature in (0.0, 0.7):
        totals = {"passes": 0, "generated": 0, "decode": 0.0, "serial": 0.0, "steps": 0}
        spent.update(propose=0.0, observe=0.0)
        identical = True
        for seed, prompt in enumerate(prompts):
            options = dict(max_new_tokens=tokens, temperature=temperature, seed=seed,
                           stop_tokens=[])
            messages = as_prompt(tokenizer, prompt)
            alone = serial.generate(messages, **options)
            result = drafted.generate(messages, **options)
            identical &= result.tokens == alone.tokens
            totals["passes"] += result.stats.target_passes
            totals["generated"] += result.stats.generated_tokens - 1
            totals["decode"] += result.stats.decode_seconds
            totals["serial"] += alone.stats.decode_seconds
            totals["steps"] += alone.stats.target_passes
        passes = totals["passes"]
        head_ms = (spent["propose"] + spent["observe"]) / passes * 1e3
        records.append({
            "temperature": temperature, "tokens_per_pass": round(totals["generated"] / passes, 3),
            "pass_ms": round(totals["decode"] / passes * 1e3, 3),
            "head_propose_ms": round(spent["propose"] / passes * 1e3, 3),
            "head_observe_ms": round(spent["observe"] / passes * 1e3, 3),
            "verify_and_rest_ms": round(totals["decode"] / passes * 1e3 - head_ms, 3),
            "serial_step_ms": round(totals["serial"] / totals["steps"] * 1e3, 3),
            "speed_over_serial": round(totals["serial"] / totals["decode"], 3),
            "identical_to_serial": identical})
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", default=None, help="head folder (default: the bundled one)")
    parser.add_argument("--sizes", default="2048,4096,8192,16384,49152",
                        help="draft vocabulary sizes (at most the target's vocabulary)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128,
                        help="new tokens per chat prompt of the decode breakdown (0: none)")
    parser.add_argument("--frequency-prompts", type=int, default=100,
                        help="training prompts whose replies rank the ids (default: 100)")
    parser.add_argument("--save-heads", default=None, help="write the resized heads here")
    parser.add_argument("--model", default=None,
                        help="GGUF file or folder (default: the bundled SmolLM2); --head "
                             "then names a head trained for it")
    args = parser.parse_args()
    import exactdraft as xd
    from exactdraft.drafters.head_model import HeadWeights

    target, tokenizer = bundled_target(args.threads, args.model)
    folder = args.head or xd.DraftHead.from_pretrained(None, target).source
    weights = HeadWeights.load(folder)
    info = machine()
    print(f"SIMD level {info['simd_level']} ({info['cpu']}), {args.threads} threads; context "
          f"{args.context}, median of {args.repeats}; head {Path(folder).name}")
    serial = xd.Generator(target, tokenizer=tokenizer)
    order = frequency_order(serial, args.frequency_prompts, 128)
    resized_heads = {size: resized(weights, size, order)
                     for size in (int(size) for size in args.sizes.split(","))}
    shares = coverage(serial, {size: head.tensors["draft_ids"]
                               for size, head in resized_heads.items()}, 128)
    heads = {size: xd.DraftHead(target, head, source=folder)
             for size, head in resized_heads.items()}
    for record in head_costs(heads, target, args.context, args.repeats):
        print(json.dumps({**record, "greedy_chat_tokens_inside": round(
            shares[record["draft_vocab"]], 4)}), flush=True)
    if args.save_heads:
        for size, head in resized_heads.items():
            head.save(Path(args.save_heads) / f"vocab-{size}")
    if args.tokens <= 0:
        return 0
    print(f"decode on {len(PROMPTS)} chat prompts, {args.tokens} tokens, max_draft 4, adaptive "
          "depth off; per target pass (the serial step: per token):")
    identical = True
    for record in decode_breakdown(target, tokenizer,
                                   xd.DraftHead(target, weights, source=folder), PROMPTS,
                                   args.tokens):
        identical &= record["identical_to_serial"]
        print(json.dumps(record), flush=True)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
