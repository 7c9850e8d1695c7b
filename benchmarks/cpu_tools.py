"""One runner per tool for benchmarks/cpu_bench.py: exactdraft, transformers and llama.cpp.

Each runner loads the model once and then answers `generate(workload, drafted)` with the new
token ids, the time to the first token and the decode time (after the first token), plus
`prefill(tokens)` and, where the tool exposes a forward pass, `verify_cost(width)`. Every tool
generates exactly the requested number of tokens (end-of-sequence does not stop it), so
decode speeds compare like with like.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

CHAT_PROMPT = "Explain how a hash map works, what makes lookups fast, and when they get slow."


@dataclass
class Workload:
    name: str
    prompt: str  # the user message; each tool renders it with the model's chat template
    temperature: float
    seed: int = 1234


@dataclass
class Timed:
    tokens: list[int]
    first_token_seconds: float
    decode_seconds: float
    tokens_per_pass: float | None = None


class ExactdraftRunner:
    """`drafter`: "lookup" (PromptLookup), "head" (the bundled DraftHead, chains), "tree"
    (the bundled DraftHead proposing trees of width 2) or "lookup+head" (FallbackDrafter:
    lookup where it has a guess, else the head's chain)."""

    def __init__(self, model: str, quantized: bool, drafter: str = "lookup") -> None:
        import exactdraft as xd
        from exactdraft.pretrained import build_target, load_checkpoint

        checkpoint = load_checkpoint(model, keep_quantized=quantized)
        self.target = build_target(checkpoint, "torch")
        self.tokenizer = checkpoint.tokenizer
        self.serial = xd.Generator(self.target, tokenizer=self.tokenizer)
        tree = drafter == "tree"
        head = None if drafter == "lookup" else \
            xd.DraftHead.from_pretrained(None, self.target, max_draft=6 if tree else 4,
                                         tree_width=2 if tree else 1)
        if drafter == "lookup":
            draft = xd.PromptLookup(max_draft=8)
        elif drafter == "lookup+head":
            draft = xd.FallbackDrafter(xd.PromptLookup(max_draft=8), head)
        else:
            draft = head
        self.drafted = xd.Generator(self.target, draft, tokenizer=self.tokenizer)
        self.xd = xd

    def prompt_ids(self, workload: Workload) -> list[int]:
        chat = [{"role": "user", "content": workload.prompt}]
        if self.tokenizer is None:
            return [(3 * i + 1) % self.target.vocab_size for i in range(64)]
        if self.tokenizer.chat_template is None:
            return self.tokenizer.encode(workload.prompt)
        return self.tokenizer.encode(self.tokenizer.render_chat(chat), add_special_tokens=False)

    def generate(self, workload: Workload, tokens: int, drafted: bool) -> Timed:
        params = self.xd.SamplingParams(temperature=workload.temperature, top_p=0.95,
                                        seed=workload.seed)
        generator = self.drafted if drafted else self.serial
        result = generator.generate(self.prompt_ids(workload), tokens, params, stop_tokens=[])
        stats = result.stats
        return Timed(result.tokens, stats.prefill_seconds, stats.decode_seconds,
                     stats.tokens_per_pass)

    def prefill(self, ids: list[int]) -> float:
        state = self.target.new_state()
        started = time.perf_counter()
        for begin in range(0, len(ids), 512):
            self.target.forward(state, ids[begin:begin + 512])
        return time.perf_counter() - started

    def verify_cost(self, context: list[int], width: int, repeats: int) -> float:
        state = self.target.new_state()
        self.target.forward(state, context)
        window = [(7 * i + 3) % self.target.vocab_size for i in range(width)]
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            self.target.forward(state, window, rows="all")
            best = min(best, time.perf_counter() - started)
            self.target.truncate(state, len(context))
        return best


class TransformersRunner:
    """Hugging Face transformers on the same file (GGUF dequantized to float32 by transformers)."""

    def __init__(self, model: str) -> None:
        import os

        import torch
        import transformers

        kwargs: dict[str, Any] = {"dtype": torch.float32}
        if model.endswith(".gguf"):
            kwargs["gguf_file"] = os.path.basename(model)
            folder = os.path.dirname(model)
        else:
            folder = model
        self.torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **{
            k: v for k, v in kwargs.items() if k == "gguf_file"})
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, **kwargs).eval()

    def prompt_ids(self, workload: Workload) -> list[int]:
        chat = [{"role": "user", "content": workload.prompt}]
        ids = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def _run(self, ids: list[int], tokens: int, workload: Workload, drafted: bool) -> Any:
        torch = self.torch
        options: dict[str, Any] = dict(max_new_tokens=tokens, min_new_tokens=tokens,
                                       pad_token_id=self.tokenizer.eos_token_id)
        if workload.temperature > 0:
            options.update(do_sample=True, temperature=workload.temperature, top_p=0.95)
            torch.manual_seed(workload.seed)
        else:
            options.update(do_sample=False)
        if drafted:
            options["prompt_lookup_num_tokens"] = 10
        with torch.no_grad():
            return self.model.generate(torch.tensor([ids]), **options)[0, len(ids):].tolist()

    def generate(self, workload: Workload, tokens: int, drafted: bool) -> Timed:
        ids = self.prompt_ids(workload)
        started = time.perf_counter()
        self._run(ids, 1, workload, drafted)
        first = time.perf_counter() - started
        started = time.perf_counter()
        out = self._run(ids, tokens, workload, drafted)
        total = time.perf_counter() - started
        return Timed(out, first, max(total - first, 1e-9))

    def prefill(self, ids: list[int]) -> float:
        with self.torch.no_grad():
            started = time.perf_counter()
            self.model(self.torch.tensor([ids]))
            return time.perf_counter() - started


class LlamaCppRunner:
    """llama.cpp through llama-cpp-python on the GGUF file as stored (its own quantized kernels)."""

    def __init__(self, model: str, threads: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        common = dict(model_path=model, n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                      verbose=False, seed=1234)
        self.serial = Llama(**common)
        # Verifying drafts reads the logits of every row, which llama-cpp-python keeps only
        # with logits_all=True.
        self.drafted = Llama(**common, logits_all=True,
                             draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))

    def prompt_ids(self, workload: Workload) -> list[int]:
        template = self.serial.metadata.get("tokenizer.chat_template") or ""
        if "<|im_start|>" not in template:  # a base model (Gemma 3 270M): the prompt as text
            return self.serial.tokenize(workload.prompt.encode(), add_bos=True, special=True)
        text = ("<|im_start|>user\n" + workload.prompt + "<|im_end|>\n<|im_start|>assistant\n")
        return self.serial.tokenize(text.encode(), add_bos=False, special=True)

    def generate(self, workload: Workload, tokens: int, drafted: bool) -> Timed:
        llm = self.drafted if drafted else self.serial
        llm.reset()
        llm.set_seed(workload.seed)
        ids = self.prompt_ids(workload)
        out: list[int] = []
        started = time.perf_counter()
        first = 0.0
        stream = llm.generate(ids, temp=workload.temperature, top_k=0, top_p=0.95,
                              reset=True)
        for token in stream:
            if not out:
                first = time.perf_counter() - started
            out.append(int(token))
            if len(out) == tokens:
                break
        total = time.perf_counter() - started
        return Timed(out, first, max(total - first, 1e-9))

    def prefill(self, ids: list[int]) -> float:
        self.serial.reset()
        started = time.perf_counter()
        self.serial.eval(ids)
        return time.perf_counter() - started
