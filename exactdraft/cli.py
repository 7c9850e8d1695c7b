"""The `exactdraft` command: generate text, and check drafted output against serial output.

Invariant: every failure the user can cause (a missing model, a bad argument, an unsupported
checkpoint) ends the command with a one-line message and a non-zero exit status, never a
traceback; `check` exits non-zero whenever any drafted case differs from its serial case.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
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


def _sampling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=256)


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="folder, .gguf file or hub id (default: the bundled SmolLM2)")
    parser.add_argument("--backend", default="auto", help="auto, torch, mlx, or a registered name")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--drafter", default="lookup",
                        help="lookup, model:PATH (a smaller model with the same vocabulary), "
                             "or none")
    parser.add_argument("--max-draft", type=int, default=None,
                        help="most drafts per pass (default: 8 for lookup, 4 for a model)")
    parser.add_argument("--quantized", action="store_true",
                        help="keep GGUF q8_0/q4_0/q4_1 matrices in their blocks (less memory "
                             "traffic) instead of dequantizing them to float32")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactdraft", description=(
        "Drafted generation whose output is byte-identical to serial generation."))
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate text, streaming it")
    _model_arguments(generate)
    source = generate.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="raw prompt text")
    source.add_argument("--chat", help="a user message, rendered with the chat template")
    generate.add_argument("--system", default=None, help="system message for --chat")
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--seed", type=int, default=None)
    _sampling_arguments(generate)
    generate.add_argument("--no-drafts", action="store_true", help="serial decoding only")
    generate.add_argument("--compare", action="store_true",
                          help="also run serially and show that the two replies are identical")
    check = commands.add_parser("check", help="drafted vs serial, case by case")
    _model_arguments(check)
    check.add_argument("--prompts", default=None,
                       help="a text file with one prompt per line, or .jsonl of strings or "
                            "chat message lists (default: a built-in set)")
    check.add_argument("--raw", action="store_true",
                       help="use prompts as raw text instead of chat messages")
    check.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per case")
    check.add_argument("--temperatures", default="0,0.7,1.0",
                       help="comma-separated temperatures")
    _sampling_arguments(check)
    check.set_defaults(max_new_tokens=64)
    return parser


def _drafter(spec: str, max_draft: int | None, options: dict[str, Any]) -> Any:
    import exactdraft as xd

    if spec == "none":
        return None
    if spec == "lookup":
        return xd.PromptLookup(max_draft=max_draft or 8)
    if spec.startswith("model:"):
        return xd.DraftModel.from_pretrained(spec[len("model:"):], max_draft=max_draft or 4,
                                             **options)
    raise ValueError(f"unknown drafter {spec!r}: use lookup, model:PATH or none")


def _generator(args: argparse.Namespace) -> Any:
    import exactdraft as xd

    options = dict(backend=args.backend, device=args.device, dtype=args.dtype,
                   keep_quantized=args.quantized)
    return xd.Generator.from_pretrained(args.model, drafter=_drafter(args.drafter,
                                                                     args.max_draft, options),
                                        **options)


def _sampling(args: argparse.Namespace, temperature: float, seed: int | None) -> Any:
    import exactdraft as xd

    return xd.SamplingParams(temperature=temperature, top_k=args.top_k, top_p=args.top_p,
                             min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                             seed=seed)


def _chat(text: str, system: str | None = None) -> list[dict[str, str]]:
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


def run_generate(args: argparse.Namespace) -> int:
    generator = _generator(args)
    prompt = args.prompt if args.prompt is not None else _chat(args.chat, args.system)
    params = _sampling(args, args.temperature, args.seed)
    result = None
    for chunk in generator.stream(prompt, args.max_new_tokens, params,
                                  drafts=not args.no_drafts):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        result = chunk.result or result
    print()
    print(("drafted " if result.stats.drafting else "") + summary(result), file=sys.stderr)
    if not args.compare:
        return 0
    serial = generator.generate(prompt, args.max_new_tokens, params.with_seed(result.seed),
                                drafts=False)
    print("serial  " + summary(serial), file=sys.stderr)
    same = serial.tokens == result.tokens
    speedup = (result.stats.tokens_per_second / serial.stats.tokens_per_second
               if serial.stats.tokens_per_second else 0.0)
    print(f"identical: {'yes' if same else 'NO'} ({len(result.tokens)} tokens); drafted decode "
          f"{speedup:.2f}x serial", file=sys.stderr)
    return 0 if same else 1


def read_prompts(path: str | None, raw: bool) -> list[Any]:
    if path is None:
        texts: list[Any] = list(DEFAULT_PROMPTS)
    elif path.endswith(".jsonl"):
        with open(path) as handle:
            texts = [json.loads(line) for line in handle if line.strip()]
    else:
        with open(path) as handle:
            texts = [line.rstrip("\n").replace("\\n", "\n") for line in handle if line.strip()]
    if not texts:
        raise ValueError(f"no prompts in {path}")
    return [t if raw or not isinstance(t, str) else _chat(t) for t in texts]


def run_check(args: argparse.Namespace) -> int:
    from exactdraft.check import check_exactness

    generator = _generator(args)
    if generator.drafter is None:
        raise ValueError("check needs a drafter (lookup or model:PATH)")
    if generator.tokenizer is None or getattr(generator.tokenizer, "chat_template", None) is None:
        args.raw = True
    prompts = read_prompts(args.prompts, args.raw)
    temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    settings = [_sampling(args, t, 0) for t in temperatures]
    report = check_exactness(generator, prompts, range(args.seeds), settings,
                             args.max_new_tokens)
    if report.drafting_note:
        print(f"load-time guard: drafting would be off for this model ({report.drafting_note});"
              " measuring it anyway", file=sys.stderr)
    else:
        print("load-time guard: verify passes equal single steps on these weights",
              file=sys.stderr)
    print(report.table())
    if report.passed:
        print(f"all {len(report.cases)} cases identical")
        return 0
    print(report.failures())
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from exactdraft.errors import ExactdraftError

    try:
        return run_generate(args) if args.command == "generate" else run_check(args)
    except (ExactdraftError, ValueError, OSError, ImportError) as error:
        print(f"exactdraft: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
