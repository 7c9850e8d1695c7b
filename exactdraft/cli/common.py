"""What the command line's parts share: its constants, the model it loads, the sampling it asks
for, and how it reports a result.

Invariant: the sampling a command runs with is the model's default with exactly the settings
named on the command line replaced; nothing else changes it.
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in three sentences why the sky is blue.",
    "Rename the variable `total` to `subtotal` in this code and return the full code:\n"
    "def price(items):\n    total = 0\n    for item in items:\n        total += item.cost\n"
    "    return total\n",
    "List five uses of a hash map.",
    "What is the capital of France? Answer in one word, then give one fact about it.",
]
MODEL_DEFAULT = "the model's generation_config.json, else {}"
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_ENGINE_FAILED = 3  # serve: the engine stopped after a failure (a rank died, a pass raised)
DEFAULT_DRAFTER = "lookup"
STDIN = "-"


def explicit_sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling settings given on the command line (the others keep the model's)."""
    names = ("top_k", "top_p", "min_p", "repetition_penalty", "temperature", "seed")
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def load_generator(args: argparse.Namespace) -> Any:
    import exactdraft as xd
    from exactdraft.drafters import registry as drafters

    options = dict(backend=args.backend, device=args.device, dtype=args.dtype,
                   keep_quantized=args.quantized)
    drafter = drafters.build(args.drafter, args.max_draft, options)
    if getattr(args, "tensor_parallel", 1) > 1:
        options["tensor_parallel"] = args.tensor_parallel
    return xd.Generator.from_pretrained(args.model, drafter=drafter,
                                        adaptive_depth=args.adaptive_depth,
                                        chat_template=args.chat_template, **options)


def sampling_for(generator: Any, args: argparse.Namespace, **fixed: Any) -> Any:
    from dataclasses import replace

    return replace(generator.sampling, **{**explicit_sampling(args), **fixed})


def chat_messages(text: str, system: str | None = None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [{"role": "user", "content": text}]


def summary(result: Any) -> str:
    stats = result.stats
    drafting = (f"acceptance {stats.acceptance:.0%}" if stats.drafting else
                f"serial{' (' + stats.drafting_note + ')' if stats.drafting_note else ''}")
    return (f"[{len(result.tokens)} tokens, {stats.target_passes + stats.prefill_passes} passes, "
            f"{stats.tokens_per_pass:.2f} tokens/pass, {drafting}, "
            f"{stats.tokens_per_second:.1f} tok/s, seed {result.seed}, "
            f"finish {result.finish_reason}]")


def is_terminal(stream: Any) -> bool:
    from exactdraft.progress import enabled_for

    return enabled_for(stream, None)
