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

/* A weight matrix of the layer: one part, or parts of different formats stacked along the
 * output (q, k and v stored in different formats), part i writing the next columns_i outputs. */
struct weight_part {
    const uint8_t *data;
    const float *bias;       /* [columns] or NULL */
    ptrdiff_t columns;
    size_t row_bytes;
    int format, layout;
};

#define MAX_WEIGHT_PARTS 3

struct layer_weight {
    ptrdiff_t columns, depth; /* of the whole matrix */
    int parts;
    struct weight_part part[MAX_WEIGHT_PARTS];
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

/* One sequence's part of a pass: its next `rows` rows go into slots start .. start + rows - 1
 * of its buffers [kv_heads, capacity, head_dim]. A chain (depths NULL) sits at the positions
 * of its slots; a token tree's row r sits at position start + depths[r] and attends to the
 * keys before start and to its path, tree_paths[r * rows + d] being the row of its ancestor at
 * depth d (attention_problem.tree_paths). */
struct layer_sequence {
    float *keys, *values;
    ptrdiff_t capacity, start, rows;
    const int32_t *depths;     /* [rows] or NULL */
    const int32_t *tree_paths; /* [rows, rows], with depths */
};

/* hidden [M, hidden_size] -> out (may be hidden), M the rows of all `count` sequences in order;
 * each sequence's rows attend to its own buffers only, so a row has the bits it gets with its
 * sequence alone; cos, sin [M, D / 2]. Returns 0, or -1 when scratch memory cannot be
 * allocated. */
int run_decoder_layer(const struct layer_plan *plan, const float *hidden, float *out,
                      const struct layer_sequence *sequences, int count, const float *cos,
                      const float *sin);

#endif
