"""What a constraint costs per generated token, against a decode step: SmolLM2, JSON schema.

A serial constrained decode of the bundled SmolLM2 (or --model) on an extraction prompt: each
step runs the one-row forward pass and the keyed draw (the decode step), and the constraint's
share, `forced()` + `allowed()` + `apply_mask` + `consume()`. Then the same tokens are
replayed on fresh matchers with no model, which time `allowed()`, `consume()` and `forced()`
alone. It prints one JSON record:
the mean milliseconds of each, their ratio to the decode step (the target is <= 5%), and how
many of the tokens the grammar's forced tokens predicted (what drafting them can gain). Run on
a quiet machine:

    python benchmarks/constraint_cost.py [--model FILE] [--tokens 160] [--temperature 0.8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "email": {"type": "string"},
        "role": {"enum": ["engineer", "manager", "designer", "other"]},
        "team": {"type": "string"},
        "remote": {"type": "boolean"},
        "level": {"enum": ["junior", "mid", "senior"]},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                    "required": ["city", "country"], "additionalProperties": False},
        "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    },
    "required": ["name", "age", "email", "role", "team", "remote", "level", "address",
                 "skills"],
    "additionalProperties": False,
}
PROMPT = ("Extract the person as JSON. Text: Maria Lopez, 34, maria.lopez@example.com, a senior "
          "engineer on the payments team, works remotely from Lisbon, Portugal; she knows Rust, "
          "Go and SQL.")


def replay_cost(tokenizer, vocab_size: int, constraint, tokens: list[int]) -> dict[str, float]:
    """Mean seconds of allowed(), consume() and forced() over `tokens` on fresh matchers
    (forced() on a second one, so it cannot warm the first's caches)."""
    matcher = constraint.matcher(tokenizer, vocab_size, tokenizer.stop_token_ids)
    allowed_s, consume_s, forced_s = [], [], []
    for token in tokens:
        started = time.perf_counter()
        matcher.allowed()
        middle = time.perf_counter()
        matcher.consume(token)
        allowed_s.append(middle - started)
        consume_s.append(time.perf_counter() - middle)
    matcher = constraint.matcher(tokenizer, vocab_size, tokenizer.stop_token_ids)
    for token in tokens:
        started = time.perf_counter()
        matcher.forced()
        forced_s.append(time.perf_counter() - started)
        matcher.consume(token)
    return {"allowed": statistics.mean(allowed_s), "consume": statistics.mean(consume_s),
            "forced": statistics.mean(forced_s)}


def constrained_decode(target, tokenizer, constraint, prompt_ids: list[int], max_tokens: int,
                       params) -> tuple[list[int], dict[str, float], int]:
    """Serial constrained decode: (tokens, mean seconds per part, tokens forced() predicted)."""
    from exactdraft.constraints import apply_mask
    from exactdraft.sampling import KeyedSampler

    sampler = KeyedSampler()
    matcher = constraint.matcher(tokenizer, target.vocab_size, tokenizer.stop_token_ids)
    state = target.new_state()
    logits = target.forward(state, prompt_ids)[-1]
    tokens: list[int] = []
    step_s, mask_s, consume_s = [], [], []
    predicted = 0
    history = list(prompt_ids)
    for _ in range(max_tokens):
        started = time.perf_counter()
        guess = matcher.forced(1)
        masked = apply_mask(logits, matcher.allowed())
        masked_at = time.perf_counter()
        token = sampler.sample(masked, params, pos=len(history), history=history,
                               n_prompt=len(prompt_ids))
        drawn_at = time.perf_counter()
        matcher.consume(token)
        consumed_at = time.perf_counter()
        predicted += guess[:1] == [token]
        tokens.append(token)
        history.append(token)
        if matcher.stopped:
            break
        logits = target.forward(state, [token])[-1]
        done = time.perf_counter()
        mask_s.append(masked_at - started)
        consume_s.append(consumed_at - drawn_at)
        step_s.append((drawn_at - masked_at) + (done - consumed_at))
    means = {"step": statistics.mean(step_s), "mask": statistics.mean(mask_s),
             "consume": statistics.mean(consume_s)}
    return tokens, means, predicted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or folder (default: bundled)")
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the record here")
    args = parser.parse_args()

    from exactdraft import pretrained
    from exactdraft.constraints import Constraint, parse_json
    from exactdraft.sampling import SamplingParams

    checkpoint = pretrained.load_checkpoint(args.model)
    target = pretrained.build_target(checkpoint, "torch")
    tokenizer = checkpoint.tokenizer
    started = time.perf_counter()
    constraint = Constraint.json_schema(SCHEMA)
    constraint.matcher(tokenizer, target.vocab_size, tokenizer.stop_token_ids)
    compile_s = time.perf_counter() - started
    prompt = tokenizer.render_chat([{"role": "user", "content": PROMPT}]) \
        if tokenizer.chat_template else PROMPT
    prompt_ids = tokenizer.encode(prompt)
    params = SamplingParams(temperature=args.temperature, seed=args.seed)
    tokens, means, predicted = constrained_decode(target, tokenizer, constraint, prompt_ids,
                                                  args.tokens, params)
    replay = replay_cost(tokenizer, target.vocab_size, constraint, tokens)
    text = tokenizer.decode([t for t in tokens if t not in tokenizer.stop_token_ids])
    try:
        parse_json(text)
        parsed = True
    except ValueError:
        parsed = False
    per_token = replay["allowed"] + replay["consume"]
    record = {
        "model": args.model or "bundled SmolLM2", "vocab": target.vocab_size,
        "tokens": len(tokens), "temperature": args.temperature, "finished": tokens[-1:] != []
        and tokens[-1] in tokenizer.stop_token_ids, "parses": parsed,
        "compile_ms": round(compile_s * 1e3, 2),
        "decode_step_ms": round(means["step"] * 1e3, 3),
        "in_loop_mask_ms": round(means["mask"] * 1e3, 3),
        "in_loop_consume_ms": round(means["consume"] * 1e3, 3),
        "allowed_ms": round(replay["allowed"] * 1e3, 4),
        "consume_ms": round(replay["consume"] * 1e3, 4),
        "forced_ms": round(replay["forced"] * 1e3, 4),
        "allowed_plus_consume_over_step": round(per_token / means["step"], 4),
        "in_loop_over_step": round((means["mask"] + means["consume"]) / means["step"], 4),
        "forced_predicted_tokens": predicted,
        "text": text[:200],
    }
    print(json.dumps(record), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
