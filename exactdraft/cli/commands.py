"""The commands behind `exactdraft generate`, `check`, `serve` and `train-drafter`.

Invariant: a command reports what it ran in the same words the Python API uses (the result's
tokens, text, finish reason, stats and receipt), and `generate --compare` / `check` exit
non-zero whenever a drafted run differs from its serial run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from exactdraft.cli.common import (
    EXIT_ENGINE_FAILED,
    EXIT_INTERRUPTED,
    chat_messages,
    is_terminal,
    load_generator,
    sampling_for,
    summary,
)


def validate_serve(args: argparse.Namespace) -> None:
    import importlib.util

    from exactdraft.errors import ParameterError

    for name, low, high in (("port", 0, 65535), ("max_sequences", 1, 1024),
                            ("max_waiting", 1, 10**6), ("prefix_cache_mb", 0, 10**7),
                            ("tensor_parallel", 1, 1024)):
        value = getattr(args, name)
        if value is not None and not low <= value <= high:
            raise ParameterError(f"--{name.replace('_', '-')} must be in [{low}, {high}], got "
                                 f"{value}")
    if args.prefix_cache_file is not None:  # before a model loads, and again in build
        from exactdraft.engine.cache_file import check_location

        check_location(args.prefix_cache_file)
    if args.prefix_cache_key_file is not None:
        from exactdraft.engine.cache_file import CacheFileError
        from exactdraft.key_files import read_key

        args.prefix_cache_key = read_key(args.prefix_cache_key_file, "cache key",
                                         CacheFileError)
    if args.thinking_key_file is not None:
        from exactdraft.server.reasoning.signatures import read_thinking_key

        args.thinking_key = read_thinking_key(args.thinking_key_file)
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"serve needs {' and '.join(missing)}: pip install "
                          f"{' '.join(missing)} (or, in an exactdraft checkout, pip install -e "
                          "\".[server]\")")


def run_serve(args: argparse.Namespace) -> int:
    from exactdraft.engine import EngineFailed
    from exactdraft.server import serve
    from exactdraft.server.service import check_aliases

    if args.tensor_parallel > 1 and "RANK" not in os.environ:
        # Every rank runs this same command; rank 0 serves, the others follow its passes.
        from exactdraft.cli.ranks import run_command_ranks

        return run_command_ranks(args.argv, args.tensor_parallel)

    name = args.model_name or ("SmolLM2-135M-Instruct" if args.model is None else
                               os.path.basename(os.path.normpath(args.model)))
    aliases = {alias: served or name for alias, _, served in
               (item.partition("=") for item in args.model_alias)}
    check_aliases(name, aliases)  # before loading
    generator = load_generator(args)

    def ready(bound: tuple[str, int]) -> None:
        print(f"exactdraft: serving {name} on http://{bound[0]}:{bound[1]}", flush=True)

    cache_mb = args.prefix_cache_mb
    try:
        serve(generator, name, host=args.host, port=args.port,
              max_sequences=args.max_sequences, max_waiting=args.max_waiting,
              prefix_cache_bytes=None if cache_mb is None else cache_mb * 2**20,
              prefix_cache_file=args.prefix_cache_file,
              prefix_cache_key=getattr(args, "prefix_cache_key", None), log_level=args.log_level,
              model_aliases=aliases or None, clamp_max_tokens=args.clamp_max_tokens,
              thinking_key=getattr(args, "thinking_key", None), ready=ready)
    except EngineFailed as error:  # a supervisor restarts a server that exits non-zero
        print(f"exactdraft: the server stopped: {error}", file=sys.stderr, flush=True)
        return EXIT_ENGINE_FAILED
    return 0


def parse_temperatures(text: str) -> list[float]:
    import exactdraft as xd
    from exactdraft.errors import ParameterError

    values = []
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            values.append(float(item))
        except ValueError:
            raise ParameterError(f"--temperatures: {item.strip()!r} is not a number") from None
        xd.SamplingParams(temperature=values[-1])
    if not values:
        raise ParameterError(f"--temperatures: no temperature in {text!r}")
    return values


def run_generate(args: argparse.Namespace) -> int:
    generator = load_generator(args)
    chat = args.prompt_is_chat
    if chat is None:
        chat = generator.tokenizer is not None and \
            getattr(generator.tokenizer, "chat_template", None) is not None
    prompt = chat_messages(args.prompt_text, args.system) if chat else args.prompt_text
    params = sampling_for(generator, args)
    if args.json:
        return print_json(generator, args, prompt, params)
    stream = generator.stream(prompt, args.max_new_tokens, params, stop=args.stop,
                              constraint=args.constraint,
                              drafts=not args.no_drafts)
    shown = 0
    try:
        for chunk in stream:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            shown += len(chunk.text)
    except KeyboardInterrupt:
        stream.close()
        result = stream.result  # what was committed before the interrupt
        if result.text:
            sys.stdout.write(result.text[shown:])  # text held back for a stop string
        print()
        print(("drafted " if result.stats.drafting else "") + summary(result), file=sys.stderr)
        return EXIT_INTERRUPTED
    result = stream.result
    print()
    print(("drafted " if result.stats.drafting else "") + summary(result), file=sys.stderr)
    if not args.compare:
        return 0
    serial = generator.generate(prompt, args.max_new_tokens, params.with_seed(result.seed),
                                constraint=args.constraint,
                                stop=args.stop, drafts=False)
    print("serial  " + summary(serial), file=sys.stderr)
    same = serial.tokens == result.tokens
    speedup = (result.stats.tokens_per_second / serial.stats.tokens_per_second
               if serial.stats.tokens_per_second else 0.0)
    print(f"identical: {'yes' if same else 'NO'} ({len(result.tokens)} tokens); drafted decode "
          f"{speedup:.2f}x serial", file=sys.stderr)
    return 0 if same else 1


def result_json(generator: Any, result: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from exactdraft.results import receipt

    stats = asdict(result.stats)
    stats.update(acceptance=result.stats.acceptance, tokens_per_pass=result.stats.tokens_per_pass,
                 tokens_per_second=result.stats.tokens_per_second)
    return {"tokens": result.tokens, "text": result.text, "finish_reason": result.finish_reason,
            "stop": result.stop, "seed": result.seed, "prompt_tokens": result.prompt_tokens,
            "stats": stats, "receipt": receipt(generator.target, result)}


def print_json(generator: Any, args: argparse.Namespace, prompt: Any, params: Any) -> int:
    """--json: the reply as one JSON object on stdout (with --compare, the serial run's too)."""
    result = generator.generate(prompt, args.max_new_tokens, params, stop=args.stop,
                                constraint=args.constraint,
                                drafts=not args.no_drafts)
    document = result_json(generator, result)
    status = 0
    if args.compare:
        serial = generator.generate(prompt, args.max_new_tokens, params.with_seed(result.seed),
                                    constraint=args.constraint,
                                    stop=args.stop, drafts=False)
        document["serial"] = result_json(generator, serial)
        document["identical"] = serial.tokens == result.tokens
        status = 0 if document["identical"] else 1
    print(json.dumps(document, ensure_ascii=False))
    return status


def run_check(args: argparse.Namespace) -> int:
    from exactdraft.check import check_exactness

    if not is_terminal(sys.stdout):  # a log hears what is coming before the model loads
        prompts, seeds, temperatures = (len(args.prompt_list), args.seeds,
                                        len(args.temperature_list))
        print(f"checking {prompts * seeds * temperatures} cases ({prompts} prompts x {seeds} "
              f"seeds x {temperatures} temperatures), drafted against serial; loading the "
              "model", flush=True)
    generator = load_generator(args)
    raw = args.raw or generator.tokenizer is None or \
        getattr(generator.tokenizer, "chat_template", None) is None
    prompts = [t if raw or not isinstance(t, str) else chat_messages(t) for t in args.prompt_list]
    settings = [sampling_for(generator, args, temperature=t, seed=0)
                for t in args.temperature_list]
    report = check_exactness(generator, prompts, range(args.seeds), settings,
                             args.max_new_tokens, on_case=None if is_terminal(sys.stdout) else
                             _print_case)
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


def _print_case(case: Any, done: int, total: int) -> None:
    """Where stdout is a log or a pipe, a line per case as it is decided (a terminal shows the
    progress bar instead)."""
    print(f"case {done}/{total}: {case.line()}", flush=True)


def run_train(args: argparse.Namespace) -> int:
    from exactdraft.training.command import run

    return run(args)
