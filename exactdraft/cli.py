"""The `exactdraft` command: generate text, check drafted output against serial output, serve
a model over HTTP (OpenAI and Anthropic APIs), and train a draft head (train-drafter).

Invariant: every failure the user can cause (a missing model, a bad argument, an unsupported
checkpoint) ends the command with a one-line message and a non-zero exit status, never a
traceback, and every argument is checked before a model is loaded; `check` exits non-zero
whenever any drafted case differs from its serial case. A reader that goes away (`| head`)
ends the command quietly; Ctrl-C during a reply prints what was generated and its summary.
"""

from __future__ import annotations

import argparse
import json
import os
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
MODEL_DEFAULT = "the model's generation_config.json, else {}"
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left
EXIT_INTERRUPTED = 130  # 128 + SIGINT
DEFAULT_DRAFTER = "lookup"
STDIN = "-"


def _sampling_arguments(parser: argparse.ArgumentParser, check: bool = False) -> None:
    parser.add_argument("--top-k", type=int, default=None,
                        help="keep the k most likely tokens, 0 = off (default: "
                             f"{MODEL_DEFAULT.format('0')})")
    parser.add_argument("--top-p", type=float, default=None,
                        help="nucleus sampling threshold in (0, 1] (default: "
                             f"{MODEL_DEFAULT.format('1.0')})")
    parser.add_argument("--min-p", type=float, default=None,
                        help="drop tokens below this fraction of the best one's probability "
                             f"(default: {MODEL_DEFAULT.format('0.0')})")
    parser.add_argument("--repetition-penalty", type=float, default=None,
                        help=f"1 = off (default: {MODEL_DEFAULT.format('1.0')})")
    parser.add_argument("--max-new-tokens", "--max-tokens", type=int,
                        default=64 if check else 256,
                        help=f"most tokens per reply (default: {64 if check else 256})")


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    from exactdraft.drafters import registry as drafters

    parser.add_argument("model", nargs="?", default=None,
                        help="folder, .gguf file or hub id (default: the bundled SmolLM2)")
    parser.add_argument("--backend", default="auto",
                        help="auto, torch, torch-padded, mlx, or a registered name "
                             "(default: auto)")
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:1, gpu (MLX) ... (default: the backend's choice)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="compute dtype (default: float32, or the backend's choice)")
    parser.add_argument("--drafter", default=DEFAULT_DRAFTER,
                        help=drafters.help_text(DEFAULT_DRAFTER))
    parser.add_argument("--max-draft", type=int, default=None, help=drafters.max_draft_help())
    parser.add_argument("--quantized", action=argparse.BooleanOptionalAction, default=True,
                        help="keep GGUF q8_0/q4_0/q4_1 matrices in their blocks, the fast path; "
                             "--no-quantized dequantizes them to float32 (default: on)")
    parser.add_argument("--adaptive-depth", action=argparse.BooleanOptionalAction, default=True,
                        help="verify only as many drafts per pass as pay off, judged from pass "
                             "costs timed at load; --no-adaptive-depth always verifies "
                             "--max-draft, so two processes draft alike (default: on)")


def build_parser() -> argparse.ArgumentParser:
    from exactdraft import __version__

    parser = argparse.ArgumentParser(prog="exactdraft", description=(
        "Drafted generation whose output is byte-identical to serial generation."))
    parser.add_argument("-V", "--version", action="version", version=f"exactdraft {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    generate = commands.add_parser("generate", help="generate text, streaming it")
    _model_arguments(generate)
    generate.add_argument("stdin", nargs="?", default=None, choices=[STDIN], metavar="-",
                          help="read the prompt from stdin, as --prompt-file - does")
    source = generate.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="raw prompt text, - for stdin (one of --prompt, "
                        "--chat, --prompt-file or - is required)")
    source.add_argument("--chat", help="a user message, rendered with the chat template, - for "
                        "stdin (one of the prompt sources is required)")
    source.add_argument("--prompt-file", metavar="PATH",
                        help="a file holding the prompt, - for stdin: a user message, or raw "
                             "text with --raw or when the model has no chat template (one of "
                             "the prompt sources is required)")
    generate.add_argument("--raw", action="store_true",
                          help="send --prompt-file's or stdin's text raw instead of as a chat "
                               "message (default: off)")
    generate.add_argument("--system", default=None,
                          help="system message for --chat (default: none)")
    generate.add_argument("--temperature", type=float, default=None,
                          help="0 = greedy (default: "
                               f"{MODEL_DEFAULT.format('1.0, the model distribution')})")
    generate.add_argument("--seed", type=int, default=None,
                          help="sampling seed, printed in the summary so a reply can be "
                               "replayed (default: a fresh one)")
    generate.add_argument("--stop", action="append", default=[], metavar="TEXT",
                          help="end the reply before this text; repeatable (default: none, "
                               "the model's stop tokens always apply)")
    _sampling_arguments(generate)
    generate.add_argument("--no-drafts", action="store_true",
                          help="serial decoding only (default: off)")
    generate.add_argument("--compare", action="store_true",
                          help="also run serially and show that the two replies are identical "
                               "(default: off)")
    generate.add_argument("--json", action="store_true",
                          help="print one JSON object instead of streaming text: tokens, "
                               "text, finish reason, stats and receipt (default: off)")
    check = commands.add_parser("check", help="drafted vs serial, case by case")
    _model_arguments(check)
    check.add_argument("--prompts", default=None,
                       help="a text file with one prompt per line, or .jsonl of strings or "
                            "chat message lists (default: a built-in set of 5)")
    check.add_argument("--raw", action="store_true",
                       help="use prompts as raw text instead of chat messages (default: off)")
    check.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per case (default: 3)")
    check.add_argument("--temperatures", default="0,0.7,1.0",
                       help="comma-separated temperatures (default: 0,0.7,1.0)")
    _sampling_arguments(check, check=True)
    serve = commands.add_parser("serve", help="serve the model over HTTP: OpenAI "
                                "/v1/chat/completions, /v1/completions, /v1/responses, "
                                "/v1/models, Anthropic /v1/messages (and count_tokens), "
                                "/health and /metrics (needs exactdraft[server])")
    _model_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on "
                       "(default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000,
                       help="port to listen on, 0 = any free port (default: 8000)")
    serve.add_argument("--model-name", default=None,
                       help="the model's name in the APIs (default: the file or folder name)")
    serve.add_argument("--max-sequences", type=int, default=8,
                       help="sequences sharing a model pass (default: 8)")
    serve.add_argument("--max-waiting", type=int, default=64,
                       help="requests queued beyond those before answering 429 (default: 64)")
    serve.add_argument("--prefix-cache-mb", type=int, default=256,
                       help="memory for cached prompt prefixes, 0 = off (default: 256)")
    serve.add_argument("--prefix-cache-file", default=None,
                       help="a safetensors file to start the prefix cache from and save it to "
                            "on shutdown (default: none)")
    serve.add_argument("--model-alias", action="append", default=[], metavar="NAME=SERVED",
                       help="another name for the served model (SERVED: its --model-name); "
                            "with any alias, other model names are answered 404 (default: "
                            "every name is served)")
    serve.add_argument("--log-level", default="info",
                       choices=("debug", "info", "warning", "error"),
                       help="the server's log: info = one line per request (default: info)")
    from exactdraft.training.command import add_arguments

    add_arguments(commands.add_parser("train-drafter", help="train a draft head (DraftHead) "
                                      "for a model on text it writes itself (needs torch)"))
    return parser


def _explicit_sampling(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling settings given on the command line (the others keep the model's)."""
    names = ("top_k", "top_p", "min_p", "repetition_penalty", "temperature", "seed")
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def validate(args: argparse.Namespace) -> None:
    """Every check that needs no model, so a typo costs no loading time."""
    import exactdraft as xd
    from exactdraft.errors import ParameterError

    if args.command == "train-drafter":
        from exactdraft.training.command import settings_from

        settings_from(args)  # raises naming the bad setting
        return
    xd.SamplingParams(**_explicit_sampling(args))  # raises naming the bad setting
    if args.command == "generate" and args.model == STDIN and args.stdin is None:
        args.model, args.stdin = None, STDIN  # `generate -`: the lone positional is the prompt
    if args.command == "serve":
        validate_serve(args)
    elif args.max_new_tokens < 0:
        raise ParameterError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if args.max_draft is not None and args.max_draft < 1:
        raise ParameterError(f"--max-draft must be >= 1, got {args.max_draft}")
    from exactdraft.drafters import registry as drafters

    drafters.parse(args.drafter, where="--drafter")  # raises naming the bad part
    if args.model is not None and not os.path.exists(os.path.expanduser(args.model)):
        from exactdraft.loading.hub import looks_like_hub_id

        if not looks_like_hub_id(args.model):
            raise xd.CheckpointError(f"no model at {args.model!r}: not a file, a folder or a "
                                     "hub id")
    if args.command == "check":
        if args.seeds < 1:
            raise ParameterError(f"--seeds must be >= 1, got {args.seeds}")
        if args.drafter == drafters.NONE:
            raise ParameterError(f"check needs a drafter ({', '.join(drafters.spellings())})")
        args.temperature_list = parse_temperatures(args.temperatures)
        args.prompt_list = read_prompts(args.prompts, raw=True)  # chat or raw: decided later
    elif args.command == "generate":
        for text in args.stop:
            if not text:
                raise ParameterError("--stop needs a non-empty text")
        args.prompt_text, args.prompt_is_chat = read_prompt_source(args)


def read_prompt_source(args: argparse.Namespace) -> tuple[str, bool | None]:
    """The prompt text, and whether it is a chat message (None: chat when the model has a
    chat template, as for --prompt-file and stdin). Read here, before any model loads."""
    from exactdraft.errors import ParameterError

    given = [name for name, value in (("--prompt", args.prompt), ("--chat", args.chat),
                                      ("--prompt-file", args.prompt_file),
                                      (STDIN, args.stdin)) if value is not None]
    if len(given) != 1:
        raise ParameterError("generate needs one prompt: --prompt TEXT, --chat TEXT, "
                             "--prompt-file PATH or - (stdin); got "
                             f"{' and '.join(given) or 'none'}")
    if args.raw and (args.prompt is not None or args.chat is not None):
        raise ParameterError("--raw applies to --prompt-file and stdin; --prompt is raw and "
                             "--chat is a chat message already")
    if args.prompt is not None:
        return _read_text(args.prompt, "--prompt "), False
    if args.chat is not None:
        return _read_text(args.chat, "--chat "), True
    if args.prompt_file is not None:
        return _read_text(args.prompt_file, "--prompt-file ", path=True), \
            False if args.raw else None
    return _read_text(STDIN, "", path=True), False if args.raw else None


def _read_text(value: str, flag: str, path: bool = False) -> str:
    """`value` itself, or the text of stdin (`-`) or of the file `value` names (`path`), with
    one trailing newline dropped (what `echo` adds). `flag` starts error messages."""
    from exactdraft.errors import ParameterError

    if value != STDIN and not path:
        return value
    where = "stdin" if value == STDIN else value
    try:
        if value == STDIN:
            if _terminal(sys.stdin):
                print("exactdraft: reading the prompt from stdin (end it with Ctrl-D)",
                      file=sys.stderr)
            text = sys.stdin.read()
        else:
            with open(os.path.expanduser(value), encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ParameterError(f"{flag}{where}: cannot be read ({error})") from None
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not text.strip():
        raise ParameterError(f"{flag}{where}: the prompt is empty")
    return text


def validate_serve(args: argparse.Namespace) -> None:
    import importlib.util

    from exactdraft.errors import ParameterError

    for name, low, high in (("port", 0, 65535), ("max_sequences", 1, 1024),
                            ("max_waiting", 1, 10**6), ("prefix_cache_mb", 0, 10**7)):
        value = getattr(args, name)
        if not low <= value <= high:
            raise ParameterError(f"--{name.replace('_', '-')} must be in [{low}, {high}], got "
                                 f"{value}")
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"serve needs {' and '.join(missing)}: pip install "
                          "\"exactdraft[server]\"")


def run_serve(args: argparse.Namespace) -> int:
    from exactdraft.server import serve
    from exactdraft.server.service import check_aliases

    name = args.model_name or ("SmolLM2-135M-Instruct" if args.model is None else
                               os.path.basename(os.path.normpath(args.model)))
    aliases = {alias: served or name for alias, _, served in
               (item.partition("=") for item in args.model_alias)}
    check_aliases(name, aliases)  # before loading
    generator = _generator(args)

    def ready(bound: tuple[str, int]) -> None:
        print(f"exactdraft: serving {name} on http://{bound[0]}:{bound[1]}", flush=True)

    serve(generator, name, host=args.host, port=args.port, max_sequences=args.max_sequences,
          max_waiting=args.max_waiting, prefix_cache_bytes=args.prefix_cache_mb * 2**20,
          prefix_cache_file=args.prefix_cache_file, log_level=args.log_level,
          model_aliases=aliases or None, ready=ready)
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


def _generator(args: argparse.Namespace) -> Any:
    import exactdraft as xd
    from exactdraft.drafters import registry as drafters

    options = dict(backend=args.backend, device=args.device, dtype=args.dtype,
                   keep_quantized=args.quantized)
    drafter = drafters.build(args.drafter, args.max_draft, options)
    return xd.Generator.from_pretrained(args.model, drafter=drafter,
                                        adaptive_depth=args.adaptive_depth, **options)


def _sampling(generator: Any, args: argparse.Namespace, **fixed: Any) -> Any:
    from dataclasses import replace

    return replace(generator.sampling, **{**_explicit_sampling(args), **fixed})


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
    chat = args.prompt_is_chat
    if chat is None:
        chat = generator.tokenizer is not None and \
            getattr(generator.tokenizer, "chat_template", None) is not None
    prompt = _chat(args.prompt_text, args.system) if chat else args.prompt_text
    params = _sampling(generator, args)
    if args.json:
        return print_json(generator, args, prompt, params)
    stream = generator.stream(prompt, args.max_new_tokens, params, stop=args.stop,
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
                                drafts=not args.no_drafts)
    document = result_json(generator, result)
    status = 0
    if args.compare:
        serial = generator.generate(prompt, args.max_new_tokens, params.with_seed(result.seed),
                                    stop=args.stop, drafts=False)
        document["serial"] = result_json(generator, serial)
        document["identical"] = serial.tokens == result.tokens
        status = 0 if document["identical"] else 1
    print(json.dumps(document, ensure_ascii=False))
    return status


def read_prompts(path: str | None, raw: bool) -> list[Any]:
    from exactdraft.errors import ParameterError

    try:
        if path is None:
            texts: list[Any] = list(DEFAULT_PROMPTS)
        elif path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as handle:
                texts = []
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            texts.append(json.loads(line))
                        except json.JSONDecodeError as error:
                            raise ParameterError(f"{path}, line {number}: not JSON "
                                                 f"({error.msg})") from None
        else:
            with open(path, encoding="utf-8") as handle:
                texts = [line.rstrip("\n").replace("\\n", "\n") for line in handle
                         if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise ParameterError(f"--prompts {path}: cannot be read ({error})") from None
    if not texts:
        raise ParameterError(f"no prompts in {path}")
    return [t if raw or not isinstance(t, str) else _chat(t) for t in texts]


def run_check(args: argparse.Namespace) -> int:
    from exactdraft.check import check_exactness

    if not _terminal(sys.stdout):  # a log hears what is coming before the model loads
        prompts, seeds, temperatures = (len(args.prompt_list), args.seeds,
                                        len(args.temperature_list))
        print(f"checking {prompts * seeds * temperatures} cases ({prompts} prompts x {seeds} "
              f"seeds x {temperatures} temperatures), drafted against serial; loading the "
              "model", flush=True)
    generator = _generator(args)
    raw = args.raw or generator.tokenizer is None or \
        getattr(generator.tokenizer, "chat_template", None) is None
    prompts = [t if raw or not isinstance(t, str) else _chat(t) for t in args.prompt_list]
    settings = [_sampling(generator, args, temperature=t, seed=0)
                for t in args.temperature_list]
    report = check_exactness(generator, prompts, range(args.seeds), settings,
                             args.max_new_tokens, on_case=None if _terminal(sys.stdout) else
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


def _terminal(stream: Any) -> bool:
    from exactdraft.progress import enabled_for

    return enabled_for(stream, None)


def _print_case(case: Any, done: int, total: int) -> None:
    """Where stdout is a log or a pipe, a line per case as it is decided (a terminal shows the
    progress bar instead)."""
    print(f"case {done}/{total}: {case.line()}", flush=True)


def run_train(args: argparse.Namespace) -> int:
    from exactdraft.training.command import run

    return run(args)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush finds no closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed command line. argparse fills optional positionals at their first chance, so
    generate's `-` (the prompt from stdin) after an option comes back unrecognized: it is
    taken here."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "generate" and extra == [STDIN] and args.stdin is None:
        args.stdin, extra = STDIN, []
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    from exactdraft.errors import ExactdraftError

    try:
        validate(args)
        run = {"generate": run_generate, "check": run_check, "serve": run_serve,
               "train-drafter": run_train}[args.command]
        status = run(args)
        sys.stdout.flush()  # here, where a reader that went away can still be caught
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except (ExactdraftError, ValueError, OSError, ImportError) as error:
        print(f"exactdraft: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
