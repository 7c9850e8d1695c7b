"""Bytes the KV cache holds per token: multi-head latent attention (deepseek_v3) against a
full-KV model of the same width and heads (llama), measured on small random checkpoints, and the
same counts at DeepSeek-V3's published shape.

Invariant measured alongside: nothing; this only counts bytes. Each checkpoint is built with
transformers in a temporary folder, loaded with exactdraft, fed a prompt, and its cache buffers
(keys and values; a latent cache's values are its keys, counted once) divided by the positions
they hold room for. The published-shape line is arithmetic from the same per-token widths the
measured caches show (latent + rope key a layer for deepseek_v3, 2 x heads x head_dim for full
K/V), in float32 as exactdraft stores them.

    python benchmarks/cache_bytes.py [--prompt 64]
"""

from __future__ import annotations

import argparse
import os
import tempfile

# The hub is not needed: the checkpoints are built here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HIDDEN, LAYERS, HEADS, VOCAB = 256, 4, 8, 128
LATENT = dict(kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
              q_lora_rank=96)
# DeepSeek-V3 as published: 61 layers, 128 heads, latent 512, rope key 64, nope 128, values 128.
PUBLISHED = dict(layers=61, heads=128, kv_lora_rank=512, qk_rope_head_dim=64,
                 qk_nope_head_dim=128, v_head_dim=128)


def build(folder: str, model_type: str, **settings) -> str:
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, intermediate_size=2 * HIDDEN,
        max_position_embeddings=512, **settings)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def cache_bytes_per_token(folder: str, prompt: int) -> float:
    import numpy as np

    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(folder, with_tokenizer=False), "torch")
    state = target.new_state()
    target.forward(state, list(np.arange(prompt) % VOCAB), rows="last")
    cache = state.cache
    buffers = {id(b): b for b in [*cache.keys, *cache.values]}.values()
    return sum(np.asarray(b).nbytes for b in buffers) / cache.capacity


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=64)
    args = parser.parse_args(argv)
    from exactdraft.kernels import cpu

    print(f"simd={cpu.simd_level()} (bytes do not depend on it)")
    with tempfile.TemporaryDirectory() as root:
        latent = build(os.path.join(root, "deepseek_v3"), "deepseek_v3", n_routed_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=64, n_shared_experts=1,
                       n_group=1, topk_group=1, first_k_dense_replace=1, **LATENT)
        # The same width and heads with full keys and values of the value head size.
        full = build(os.path.join(root, "llama"), "llama", head_dim=LATENT["v_head_dim"])
        measured = {"deepseek_v3 (latent)": cache_bytes_per_token(latent, args.prompt),
                    "llama (full K/V)": cache_bytes_per_token(full, args.prompt)}
    print(f"small checkpoints: hidden {HIDDEN}, {LAYERS} layers, {HEADS} heads, "
          f"latent {LATENT['kv_lora_rank']} + rope key {LATENT['qk_rope_head_dim']}, "
          f"full K/V head_dim {LATENT['v_head_dim']}; prompt {args.prompt}")
    print(f"{'cache':<24} {'bytes/token':>12} {'values/layer':>13}")
    for name, size in measured.items():
        print(f"{name:<24} {size:>12.0f} {size / 4 / LAYERS:>13.0f}")
    ratio = measured["llama (full K/V)"] / measured["deepseek_v3 (latent)"]
    print(f"full K/V over latent: {ratio:.2f}x")
    p = PUBLISHED
    latent_bytes = 4 * p["layers"] * (p["kv_lora_rank"] + p["qk_rope_head_dim"])
    full_bytes = 4 * p["layers"] * p["heads"] * (p["qk_nope_head_dim"] + p["qk_rope_head_dim"]
                                                 + p["v_head_dim"])
    print(f"published DeepSeek-V3 shape (float32): latent {latent_bytes:,} bytes/token, "
          f"the same attention with full K/V {full_bytes:,} ({full_bytes / latent_bytes:.1f}x)")


if __name__ == "__main__":
    main()
