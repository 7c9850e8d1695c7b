/* One decoder layer for M rows in a single call, built from the dispatcher's ops.
 *
 * Invariant: the layer calls the same kernels, in the same order, on the same values as the
 * per-op path of the torch CPU backend (exactdraft/backends/torch_cpu.py driven by
 * exactdraft/models/blocks.py's decoder_layer), so its output has the same bits; it only saves
 * the Python calls and the intermediate tensors in between.
 */
#ifndef EXACTDRAFT_CPU_DECODER_LAYER_H
#define EXACTDRAFT_CPU_DECODER_LAYER_H

#include "kernels.h"

struct layer_weight {
    const uint8_t *data;
    const float *bias;       /* [columns] or NULL */
    ptrdiff_t columns, depth;
    size_t row_bytes;
    int format, layout;
};

enum layer_activation { ACTIVATION_SILU = 0, ACTIVATION_GELU_TANH = 1 };

struct layer_plan {
    ptrdiff_t hidden_size, heads, kv_heads, head_dim, intermediate, window;
    float eps, scale;
    int activation;               /* enum layer_activation */
    const float *attention_norm, *mlp_norm;
    const float *q_norm, *k_norm; /* both NULL or both set */
    /* Norms of the attention and MLP outputs before their residual adds, or NULL. */
    const float *post_attention_norm, *post_mlp_norm;
    struct layer_weight qkv, output, gate_up, down;
};

/* hidden [M, hidden_size] -> out (may be hidden); writes keys and values [kv_heads, capacity,
 * head_dim] at positions start .. start + M - 1, which the rows occupy; cos, sin [M, D / 2].
 * Returns 0, or -1 when scratch memory cannot be allocated. */
int run_decoder_layer(const struct layer_plan *plan, const float *hidden, float *out,
                      ptrdiff_t rows, float *keys, float *values, ptrdiff_t capacity,
                      ptrdiff_t start, const float *cos, const float *sin);

#endif
