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
import os
import sys
from collections.abc import Sequence

from exactdraft.cli import commands, prompts
from exactdraft.cli.common import (
    DEFAULT_DRAFTER,
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    MODEL_DEFAULT,
    STDIN,
    explicit_sampling,
)


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
    parser.add_argument("--chat-template", default=None, metavar="NAME|PATH",
                        help="render chats with this template instead of the model's: a "
                             "built-in (gemma, chatml, harmony) or a Jinja file (default: the "
                             "model's own)")
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
    shape = generate.add_mutually_exclusive_group()
    from exactdraft.constraints.kinds import KINDS

    for kind in KINDS:
        shape.add_argument(kind.flag, metavar=kind.flag_metavar, dest=kind.name,
                           help=f"{kind.flag_help} (default: none)")
    generate.add_argument("--special-tokens", metavar="NAME,...", default=None,
                          help="the special tokens a --grammar or --gbnf names as tokens "
                               "(<|channel|>), comma-separated (default: none)")
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
                                "/health and /metrics (needs the server extra: "
                                "pip install -e \".[server]\")")
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
    serve.add_argument("--prefix-cache-mb", type=int, default=None,
                       help="memory for cached prompt prefixes in MiB, 0 = off (default: a "
                            "quarter of the available memory, 256 to 8192)")
    serve.add_argument("--prefix-cache-file", default=None,
                       help="a safetensors file to start the prefix cache from and save it to "
                            "on shutdown; its location is checked at start (default: none)")
    serve.add_argument("--prefix-cache-key-file", default=None, metavar="PATH",
                       help="a file holding a secret key (16 bytes or more): the cache file is "
                            "signed with it (HMAC-SHA256) and read only if its signature is "
                            "the key's (default: no key; the file is as trusted as its folder)")
    serve.add_argument("--thinking-key-file", default=None, metavar="PATH",
                       help="a file holding a secret key (16 bytes or more) that signs "
                            "Anthropic thinking blocks; servers that must accept each "
                            "other's blocks share it (default: a random key per server)")
    serve.add_argument("--model-alias", action="append", default=[], metavar="NAME=SERVED",
                       help="another name for the served model (SERVED: its --model-name); "
                            "with any alias, other model names are answered 404 (default: "
                            "every name is served)")
    serve.add_argument("--clamp-max-tokens", action="store_true",
                       help="lower a max_tokens past the room the prompt leaves in the "
                            "context to that room instead of refusing the request (default: "
                            "refuse, in each API's context-limit wording)")
    serve.add_argument("--log-level", default="info",
                       choices=("debug", "info", "warning", "error"),
                       help="the server's log: info = one line per request (default: info)")
    serve.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                       help="split the model over N ranks started on this machine, writing "
                            "the bits of one rank (for several machines, start each rank with "
                            "torchrun; docs/TENSOR_PARALLEL.md) (default: 1)")
    from exactdraft.training.command import add_arguments

    add_arguments(commands.add_parser("train-drafter", help="train a draft head (DraftHead) "
                                      "for a model on text it writes itself (needs torch)"))
    for command in commands.choices.values():  # `exactdraft generate -V` as well
        command.add_argument("-V", "--version", action="version",
                             version=f"exactdraft {__version__}")
    return parser


def validate(args: argparse.Namespace) -> None:
    """Every check that needs no model, so a typo costs no loading time."""
    import exactdraft as xd
    from exactdraft.errors import ParameterError

    if args.command == "train-drafter":
        from exactdraft.training.command import settings_from

        settings_from(args)  # raises naming the bad setting
        return
    xd.SamplingParams(**explicit_sampling(args))  # raises naming the bad setting
    if args.chat_template is not None:
        from exactdraft.loading.builtin_templates import chat_template_source

        chat_template_source(args.chat_template)  # raises naming the bad name or file
    if args.command == "generate" and args.model == STDIN and args.stdin is None:
        args.model, args.stdin = None, STDIN  # `generate -`: the lone positional is the prompt
    if args.command == "serve":
        commands.validate_serve(args)
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
        args.temperature_list = commands.parse_temperatures(args.temperatures)
        # chat or raw: decided later
        args.prompt_list = prompts.read_prompts(args.prompts, raw=True)
    elif args.command == "generate":
        for text in args.stop:
            if not text:
                raise ParameterError("--stop needs a non-empty text")
        args.prompt_text, args.prompt_is_chat = prompts.read_prompt_source(args)
        args.constraint = prompts.read_constraint(args)


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
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for the ranks serve starts
    from exactdraft.errors import ExactdraftError

    try:
        validate(args)
        run = {"generate": commands.run_generate, "check": commands.run_check,
               "serve": commands.run_serve, "train-drafter": commands.run_train}[args.command]
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
