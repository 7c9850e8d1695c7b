"""Wrapping a Generator in a small app function, as one would in a notebook or service.

    python examples/app.py [--max-new-tokens N]

`rename_identifier` asks the model to rename a variable in a piece of code and streams the
reply; drafting (prompt lookup) makes the copy-heavy reply fast without changing a token of it.
"""

import argparse
import sys
from pathlib import Path

import exactdraft as xd

GENERATOR = None


def generator() -> xd.Generator:
    """Load the model once per process."""
    global GENERATOR
    if GENERATOR is None:
        GENERATOR = xd.Generator.from_pretrained(drafter=xd.PromptLookup(max_draft=8))
    return GENERATOR


def rename_identifier(code: str, old: str, new: str, max_new_tokens: int = 256,
                      seed: int = 0, stream=sys.stdout) -> xd.GenerationResult:
    request = (f"Rename the variable `{old}` to `{new}` everywhere in this code. Reply with the "
               f"complete updated code only, in a code block.\n\n```python\n{code}\n```")
    result = None
    for chunk in generator().stream([{"role": "user", "content": request}], max_new_tokens,
                                    xd.SamplingParams(temperature=0.0, seed=seed)):
        stream.write(chunk.text)
        stream.flush()
        result = chunk.result or result
    stream.write("\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    prompt = (Path(__file__).parent / "prompts" / "code_edit.txt").read_text()
    code = prompt.split("```python\n", 1)[1].split("```", 1)[0]
    result = rename_identifier(code, "records", "entries", args.max_new_tokens)
    stats = result.stats
    print(f"[{len(result.tokens)} tokens in {stats.target_passes} passes, "
          f"{stats.tokens_per_second:.1f} tok/s, acceptance {stats.acceptance:.0%}]")
