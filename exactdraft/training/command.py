"""`exactdraft train-drafter TARGET --out DIR`: the command line of train_draft_head.

Invariant: every argument is checked before the target loads, and the command resumes a run
whose DIR holds a checkpoint of the same settings (train_draft_head says what it promises).
"""

from __future__ import annotations

import argparse
from typing import Any

from exactdraft.training.trainer import TrainingSettings

DEFAULTS = TrainingSettings()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=None,
                        help="folder, .gguf file or hub id (default: the bundled SmolLM2)")
    parser.add_argument("--out", required=True,
                        help="folder for the head (config.json, head.safetensors), its corpus "
                             "and its checkpoints; an interrupted run there resumes (required)")
    parser.add_argument("--seed", type=int, default=DEFAULTS.seed,
                        help=f"seed of the corpus, the initial weights and the order "
                             f"(default: {DEFAULTS.seed})")
    parser.add_argument("--epochs", type=int, default=DEFAULTS.epochs,
                        help=f"passes over the corpus (default: {DEFAULTS.epochs})")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens,
                        help=f"longest reply written per prompt (default: "
                             f"{DEFAULTS.max_new_tokens})")
    parser.add_argument("--samples", type=int, default=DEFAULTS.samples,
                        help=f"replies written per prompt (default: {DEFAULTS.samples})")
    parser.add_argument("--draft-vocab", type=int, default=DEFAULTS.draft_vocab,
                        help=f"tokens the head can propose: the most frequent in the corpus "
                             f"(its output rows are only these; others are never drafted, "
                             f"which costs speed, never output; default: "
                             f"{DEFAULTS.draft_vocab})")
    parser.add_argument("--intermediate-size", type=int, default=None,
                        help="the head's MLP width (default: the target's)")
    parser.add_argument("--depth", type=int, default=DEFAULTS.depth,
                        help=f"drafting passes unrolled in training (default: {DEFAULTS.depth})")
    parser.add_argument("--prompts", default=None,
                        help="a text file of prompts, one per line (default: the package's "
                             "set of about 640)")
    parser.add_argument("--prompt-limit", type=int, default=None,
                        help="use only the first N prompts (default: all)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads; the same count gives the same bytes (default: "
                             "torch's)")
    parser.add_argument("--backend", default="auto", help="the target's backend (default: auto)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines on stderr (default: off)")


def settings_from(args: argparse.Namespace) -> TrainingSettings:
    settings = TrainingSettings(seed=args.seed, epochs=args.epochs,
                                max_new_tokens=args.max_new_tokens, samples=args.samples,
                                draft_vocab=args.draft_vocab, depth=args.depth,
                                intermediate_size=args.intermediate_size,
                                prompt_limit=args.prompt_limit)
    settings.check()
    return settings


def run(args: argparse.Namespace) -> int:
    from exactdraft.errors import ParameterError
    from exactdraft.generator import Generator
    from exactdraft.training.corpus import read_prompts
    from exactdraft.training.trainer import train_draft_head

    settings = settings_from(args)
    if args.threads is not None and args.threads < 1:
        raise ParameterError(f"--threads must be >= 1, got {args.threads}")
    prompts = None if args.prompts is None else read_prompts(args.prompts)
    generator: Any = Generator.from_pretrained(args.model, backend=args.backend)
    train_draft_head(generator, args.out, settings, prompts=prompts, progress=not args.quiet,
                     threads=args.threads)
    print(f"exactdraft: draft head written to {args.out}")
    return 0
