"""How often draft heads agree with their target, on chat prompts none of them trained on.

    python benchmarks/head_acceptance.py [--heads bundled,/tmp/other-head] [--tokens 128]
                                         [--max-draft 4] [--tree-width 1] [--temperatures 0,0.7]
                                         [--seeds 2]

For the bundled SmolLM2 (quantized) and each head, every (prompt, temperature, seed) case is
generated drafted with a fixed depth (adaptive depth off, so no figure depends on timing) and
serially; reported per head and temperature: tokens per target pass, the share of drafts
kept, and whether every drafted output equals its serial one. The figures are counts, so the
same heads on the same machine give the same report, and two heads compare without the noise
of a shared machine. Prints the SIMD level; exits 1 when a drafted output differed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import machine  # noqa: E402

# Chat prompts outside exactdraft/data/train_prompts.txt (topics and forms it does not use).
PROMPTS = [
    "Explain how a hash map works, what makes lookups fast, and when they get slow.",
    "What should I pack for a three-day hiking trip in the mountains?",
    "Write a cover letter opening for a junior data analyst position.",
    "How do noise-cancelling headphones work?",
    "Give me a weekly plan for learning basic Spanish.",
    "What is the difference between a mortgage and a personal loan?",
    "Write a Python function that returns the second largest number in a list.",
    "Describe what happens during a thunderstorm.",
    "Suggest five names for a small bakery and explain each one.",
    "Why do cats purr?",
]


def as_prompt(tokenizer, text: str):
    """A chat message where the tokenizer has a chat template, else the text itself."""
    if getattr(tokenizer, "chat_template", None) is None:
        return text
    return [{"role": "user", "content": text}]


def evaluate(generator, serial, prompts: list[str], temperatures: list[float], seeds: int,
             tokens: int) -> list[dict]:
    records = []
    for temperature in temperatures:
        passes = drafted = accepted = generated = 0
        identical = True
        for prompt in prompts:
            messages = as_prompt(serial.tokenizer, prompt)
            for seed in range(seeds):
                options = dict(max_new_tokens=tokens, temperature=temperature, seed=seed,
                               stop_tokens=[])
                result = generator.generate(messages, **options)
                identical &= result.tokens == serial.generate(messages, **options).tokens
                stats = result.stats
                passes += stats.target_passes
                drafted += stats.drafted
                accepted += stats.accepted
                generated += stats.generated_tokens - 1  # the first token comes from prefill
        records.append({"temperature": temperature, "cases": len(prompts) * seeds,
                        "tokens_per_pass": generated / passes if passes else None,
                        "drafts_kept": accepted / drafted if drafted else None,
                        "drafted": drafted, "accepted": accepted,
                        "identical_to_serial": identical})
    return records


def bundled_target(threads: int, model: str | None = None):
    """The bundled SmolLM2 (or `model`, a GGUF file or folder), quantized blocks kept, on
    `threads` torch and kernel threads, and its tokenizer."""
    import torch

    from exactdraft.kernels import cpu
    from exactdraft.pretrained import build_target, load_checkpoint

    torch.set_num_threads(threads)
    if cpu.available():
        cpu.set_num_threads(threads)
    checkpoint = load_checkpoint(model, keep_quantized=True)
    return build_target(checkpoint, "torch"), checkpoint.tokenizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="bundled",
                        help="comma list of head folders; 'bundled' is the packaged head")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--max-draft", type=int, default=4)
    parser.add_argument("--tree-width", type=int, default=1,
                        help="candidates per depth (2 or more: the head proposes trees)")
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--model", default=None,
                        help="GGUF file or folder (default: the bundled SmolLM2); without a "
                             "chat template the prompts are plain text")
    args = parser.parse_args()
    import exactdraft as xd

    target, tokenizer = bundled_target(args.threads, args.model)
    serial = xd.Generator(target, tokenizer=tokenizer)
    info = machine()
    print(f"SIMD level {info['simd_level']} ({info['cpu']}), {args.threads} threads; "
          f"{args.tokens} tokens, max_draft {args.max_draft}, tree width {args.tree_width}, "
          "adaptive depth off")
    failed = False
    for name in args.heads.split(","):
        head = xd.DraftHead.from_pretrained(None if name == "bundled" else name, target,
                                            max_draft=args.max_draft,
                                            tree_width=args.tree_width)
        generator = xd.Generator(target, head, tokenizer=tokenizer,
                                 adaptive_depth=False)
        for record in evaluate(generator, serial, PROMPTS[:args.prompts],
                               [float(t) for t in args.temperatures.split(",")], args.seeds,
                               args.tokens):
            failed |= not record["identical_to_serial"]
            print(json.dumps({"head": name, **record}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
