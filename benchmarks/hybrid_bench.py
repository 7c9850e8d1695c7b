"""Side-by-side CPU benchmark on random ~100M-parameter hybrid and mixture-of-experts models:
exactdraft serial and drafted (prompt lookup) decode against transformers on the same weights.

    python benchmarks/hybrid_bench.py                          # both models, 2 threads
    python benchmarks/hybrid_bench.py --models qwen3_5 --tokens 64 --threads 2

Models (random weights, saved as safetensors with transformers, float32): `qwen3_5`, a Qwen3.5
text trunk (Gated DeltaNet layers, every fourth layer gated full attention), `qwen3_moe`
(attention with 16 experts, top 2), `qwen3_next` (Gated DeltaNet with MoE) and `nemotron_h`
(Mamba-2 beside attention and MLPs). The embedding is scaled up and the mixers' output
projections down (EMBEDDING_SCALE, MIXER_SCALE), which leaves shapes, arithmetic and speed as
they are but makes the next token lean on the current one, so that a random model, like a real
one, repeats what its prompt holds. Reported per model: greedy serial decode tokens/s for
transformers (one token a call with its KV and recurrent caches, the same threads) and
exactdraft (each the best of --repeats runs), their ratio, and whether their greedy tokens
agree; exactdraft's drafted decode
with PromptLookup on a copy-heavy prompt (a passage the model wrote, then its start again), its
ratio to exactdraft's serial decode and whether the two outputs are identical; and the rollback
cost per verify pass (the time truncate takes to restore the state at the accepted length,
against the pass itself). Prints the CPU's SIMD level and the command line; writes JSON with
--json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB = 16384
MIXER_SCALE = 0.005
EMBEDDING_SCALE = 30.0
MODELS = {
    "qwen3_5": dict(model_type="qwen3_5_text", hidden_size=768, intermediate_size=2048,
                    num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
                    head_dim=96, linear_num_key_heads=4, linear_num_value_heads=8,
                    linear_key_head_dim=64, linear_value_head_dim=64),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=512, intermediate_size=1536,
                      num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=64, num_experts=16, num_experts_per_tok=2,
                      moe_intermediate_size=256, norm_topk_prob=True),
    "qwen3_next": dict(model_type="qwen3_next", hidden_size=512, intermediate_size=1536,
                       num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                       linear_key_head_dim=64, linear_value_head_dim=64, num_experts=16,
                       num_experts_per_tok=2, moe_intermediate_size=384,
                       shared_expert_intermediate_size=512),
    "nemotron_h": dict(model_type="nemotron_h", hidden_size=768, intermediate_size=2048,
                       hybrid_override_pattern="M-M*M-M-M*M-M-", num_attention_heads=8,
                       num_key_value_heads=2, head_dim=96, mamba_num_heads=24,
                       mamba_head_dim=64, ssm_state_size=64, n_groups=4),
}


def build_checkpoint(name: str, folder: str) -> int:
    """A random checkpoint of MODELS[name] in `folder`; returns its parameter count."""
    import torch
    import transformers

    settings = dict(MODELS[name], vocab_size=VOCAB, max_position_embeddings=4096)
    config = transformers.AutoConfig.for_model(settings.pop("model_type"), **settings)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape)
            if "norm" in parameter_name:
                parameter.copy_((0.0 if "qwen3" in name and "linear_attn.norm" not in
                                 parameter_name and name != "qwen3_moe" else 1.0) + 0.1 * noise)
            elif parameter_name.endswith(("bias", "A_log", ".D")):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_(noise * (1.5 / parameter.shape[-1] ** 0.5))
        # Large embedding rows and small mixer outputs make the next token lean on the current
        # one, so that the model follows a path it has walked before when the prompt holds it:
        # the copy-heavy workload prompt lookup is for. Shapes and arithmetic, and so speed,
        # are unchanged.
        outputs = ("o_proj.weight", "out_proj.weight", "down_proj.weight", "experts.down_proj")
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith(outputs):
                parameter.mul_(MIXER_SCALE)
        model.get_input_embeddings().weight.mul_(EMBEDDING_SCALE)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def copy_heavy_prompt(folder: str, walked: int = 160) -> list[int]:
    """A passage the model wrote (its greedy continuation of a random seed), then the seed and
    the passage's first tokens again: the model goes on to write the passage a second time."""
    import exactdraft as xd
    from exactdraft.guard import probe_tokens
    from exactdraft.pretrained import build_target, load_checkpoint

    seed = probe_tokens(8, VOCAB, salt=9)
    target = build_target(load_checkpoint(folder, with_tokenizer=False), "torch")
    passage = xd.Generator(target).generate(seed, walked, temperature=0.0, stop_tokens=[]).tokens
    return seed + passage + seed + passage[:8]


def transformers_decode(folder: str, prompt: list[int], tokens: int, repeats: int
                        ) -> tuple[float, list[int]]:
    """Greedy decode with transformers' caches, one token a call: the best of `repeats` runs'
    tokens/s after the first token, and the tokens."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    best = 0.0
    with torch.no_grad():
        model.generate(torch.tensor([prompt[:8]]), max_new_tokens=4, do_sample=False)  # warm up
        for _ in range(repeats):
            out = model(torch.tensor([prompt]), use_cache=True)
            cache, written = out.cache, [int(out.logits[0, -1].argmax())]
            started = time.perf_counter()
            for _ in range(tokens - 1):
                out = model(torch.tensor([written[-1:]]), cache=cache, use_cache=True)
                cache = out.cache
                written.append(int(out.logits[0, -1].argmax()))
            best = max(best, (tokens - 1) / (time.perf_counter() - started))
    return best, written


def exactdraft_runs(folder: str, prompt: list[int], tokens: int, repeats: int) -> dict:
    import exactdraft as xd
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(folder, with_tokenizer=False), "torch")
    params = xd.SamplingParams(temperature=0.0)
    serial = xd.Generator(target)
    drafted = xd.Generator(target, xd.PromptLookup(max_draft=8))
    assert drafted.drafting_enabled, drafted.drafting_note
    rollbacks: list[float] = []
    truncate = target.truncate

    def timed_truncate(state, length):
        started = time.perf_counter()
        truncate(state, length)
        rollbacks.append(time.perf_counter() - started)

    def best(generator, watch=False):
        results = []
        for _ in range(repeats):
            rollbacks.clear()
            if watch:
                target.truncate = timed_truncate
            try:
                results.append((generator.generate(prompt, tokens, params, stop_tokens=[]),
                                list(rollbacks)))
            finally:
                target.truncate = truncate
        return max(results, key=lambda r: r[0].stats.tokens_per_second)

    restore_seconds, replay_seconds = rollback_costs(target, prompt)
    serial_result, _ = best(serial)
    drafted_result, cuts = best(drafted, watch=True)
    stats = drafted_result.stats
    pass_seconds = stats.decode_seconds / max(stats.target_passes, 1)
    cut_seconds = sum(cuts) / max(len(cuts), 1)
    return {
        "serial_tokens_per_second": serial_result.stats.tokens_per_second,
        "drafted_tokens_per_second": stats.tokens_per_second,
        "drafted_identical": drafted_result.tokens == serial_result.tokens,
        "tokens_per_pass": stats.tokens_per_pass, "acceptance": stats.acceptance,
        "rollback_ms_per_pass": 1e3 * cut_seconds, "pass_ms": 1e3 * pass_seconds,
        "rollback_share": cut_seconds / pass_seconds if pass_seconds else 0.0,
        "restore_ms": 1e3 * restore_seconds, "replay_ms": 1e3 * replay_seconds,
        "state_bytes_per_position": sum(a.nbytes for layer in target.new_state().recurrent
                                        for a in layer),
        "tokens": serial_result.tokens,
    }


def rollback_costs(target, prompt: list[int], width: int = 9, repeats: int = 20
                   ) -> tuple[float, float]:
    """Seconds to truncate a `width`-row verify pass to its middle (a held snapshot), and to
    truncate past the rollback window (a replay of the kept tokens)."""
    state = target.new_state()
    target.forward(state, prompt)
    restore = []
    for _ in range(repeats):
        target.forward(state, prompt[:width], rows="all")
        started = time.perf_counter()
        target.truncate(state, len(prompt) + width // 2)
        restore.append(time.perf_counter() - started)
        target.truncate(state, len(prompt))
    started = time.perf_counter()
    target.truncate(state, len(prompt) // 2)
    return min(restore), time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="qwen3_5,qwen3_moe")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    from exactdraft.kernels import cpu

    torch.set_num_threads(args.threads)
    cpu.set_num_threads(args.threads)
    print(f"$ python {' '.join(sys.argv)}")
    print(f"SIMD level {cpu.simd_level()}, {args.threads} threads, torch {torch.__version__}")
    records = []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as folder:
            parameters = build_checkpoint(name, folder)
            prompt = copy_heavy_prompt(folder)
            theirs, their_tokens = transformers_decode(folder, prompt, args.tokens, args.repeats)
            ours = exactdraft_runs(folder, prompt, args.tokens, args.repeats)
        record = {"model": name, "parameters": parameters, "transformers_tokens_per_second":
                  theirs, "same_greedy_tokens_as_transformers": ours.pop("tokens") ==
                  their_tokens, **ours}
        records.append(record)
        print(f"{name} ({parameters / 1e6:.0f}M parameters): transformers {theirs:.1f} tok/s, "
              f"exactdraft serial {ours['serial_tokens_per_second']:.1f} tok/s "
              f"({ours['serial_tokens_per_second'] / theirs:.2f}x), drafted "
              f"{ours['drafted_tokens_per_second']:.1f} tok/s "
              f"({ours['drafted_tokens_per_second'] / ours['serial_tokens_per_second']:.2f}x "
              f"serial, identical {ours['drafted_identical']}, "
              f"{ours['tokens_per_pass']:.2f} tokens/pass); rollback "
              f"{ours['rollback_ms_per_pass']:.3f} ms per verify pass "
              f"({100 * ours['rollback_share']:.1f}% of a {ours['pass_ms']:.1f} ms pass; "
              f"restoring a snapshot {ours['restore_ms']:.3f} ms, replaying "
              f"{len(prompt) // 2} tokens past the window {ours['replay_ms']:.0f} ms, "
              f"{ours['state_bytes_per_position'] / 1e3:.0f} kB of recurrent state per held "
              f"position); "
              f"greedy tokens equal to transformers' "
              f"{record['same_greedy_tokens_as_transformers']}")
    if args.json:
        args.json.write_text(json.dumps(records, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
