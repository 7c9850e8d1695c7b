/* One decoder layer for M rows in a single call, built from the dispatcher's ops.
 *
 * Invariant: the layer calls the same kernels, in the same order, on the same values as the
 * per-op path of the torch CPU backend, so its output has the same bits:
 *   x = rms_norm(h); qkv = x W_qkv^T (+b); q, k = rms_norm per head (if set); q, k = rope;
 *   cache[start..] = k, v; a = attention(q) W_o^T (+b); a = rms_norm(a) (if set); h = h + a;
 *   x = rms_norm(h); m = act(x W_gate_up^T (+b)) W_down^T (+b); m = rms_norm(m) (if set);
 *   h = h + m.
 * Copies move values without arithmetic, and a residual add is one float addition per element,
 * as torch's `+` is.
 */
#include "decoder_layer.h"

#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

/* out [rows, w->columns] = x w^T (+ bias), part by part: a part's columns have the bits they
 * get in a matmul of their own. */
static int linear(const struct layer_weight *w, const float *x, ptrdiff_t rows, float *out)
{
    int failed = 0;
    ptrdiff_t first = 0;
    for (int i = 0; i < w->parts; i++) {
        const struct weight_part *part = &w->part[i];
        struct matmul_problem p = {.x = x, .weight = part->data, .bias = part->bias,
                                   .out = out + first, .rows = rows, .depth = w->depth,
                                   .columns = part->columns, .out_stride = w->columns,
                                   .row_bytes = part->row_bytes, .format = part->format,
                                   .layout = part->layout};
        failed |= run_matmul(&p);
        first += part->columns;
    }
    return failed;
}

static void rms_norm(const float *x, ptrdiff_t rows, ptrdiff_t width, const float *weight,
                     float eps, float *out)
{
    struct rows_problem p = {.x = x, .weight = weight, .out = out, .rows = rows, .width = width,
                             .eps = eps};
    run_rms_norm(&p);
}

/* In place: each element pair is read before it is written. */
static void rope(float *x, ptrdiff_t rows, ptrdiff_t heads, ptrdiff_t head_dim, const float *cos,
                 const float *sin)
{
    struct rows_problem p = {.x = x, .weight = cos, .weight2 = sin, .out = x, .rows = rows,
                             .heads = heads, .width = head_dim};
    run_rope(&p);
}

static void add(const float *a, const float *b, float *out, size_t count)
{
    for (size_t i = 0; i < count; i++) out[i] = a[i] + b[i];
}

int run_decoder_layer(const struct layer_plan *plan, const float *hidden, float *out,
                      const struct layer_sequence *sequences, int count, const float *cos,
                      const float *sin)
{
    ptrdiff_t rows = 0;
    for (int i = 0; i < count; i++) rows += sequences[i].rows;
    const ptrdiff_t width = plan->hidden_size, dim = plan->head_dim;
    const ptrdiff_t q_size = plan->heads * dim, kv_size = plan->kv_heads * dim;
    const ptrdiff_t qkv_width = q_size + 2 * kv_size, inner = plan->intermediate;
    const size_t m = (size_t)rows;
    const size_t floats = m * (size_t)(2 * width + qkv_width + 2 * q_size + kv_size + 3 * inner);
    char *scratch = malloc(floats * sizeof(float) + m * sizeof(int64_t));
    struct attention_problem *problems = malloc(sizeof *problems * (size_t)count);
    if (!scratch || !problems) {
        free(scratch);
        free(problems);
        return -1;
    }
    int64_t *positions = (int64_t *)scratch;
    float *normed = (float *)(positions + m), *projected = normed + m * width;
    float *qkv = projected + m * width, *q = qkv + m * qkv_width, *k = q + m * q_size;
    float *attended = k + m * kv_size, *gate_up = attended + m * q_size;
    float *gated = gate_up + 2 * m * inner;
    int failed = 0;

    rms_norm(hidden, rows, width, plan->attention_norm, plan->eps, normed);
    failed |= linear(&plan->qkv, normed, rows, qkv);
    for (size_t r = 0; r < m; r++) {
        memcpy(q + r * q_size, qkv + r * qkv_width, (size_t)q_size * sizeof(float));
        memcpy(k + r * kv_size, qkv + r * qkv_width + q_size, (size_t)kv_size * sizeof(float));
    }
    if (plan->q_norm) {
        rms_norm(q, rows * plan->heads, dim, plan->q_norm, plan->eps, q);
        rms_norm(k, rows * plan->kv_heads, dim, plan->k_norm, plan->eps, k);
    }
    rope(q, rows, plan->heads, dim, cos, sin);
    rope(k, rows, plan->kv_heads, dim, cos, sin);
    for (int i = 0, first = 0; i < count; first += (int)sequences[i++].rows) {
        const struct layer_sequence *sequence = &sequences[i];
        for (ptrdiff_t r = 0; r < sequence->rows; r++) {
            const ptrdiff_t row = first + r;
            positions[row] =
                (int64_t)(sequence->start + (sequence->depths ? sequence->depths[r] : r));
            const float *v = qkv + row * qkv_width + q_size + kv_size;
            for (ptrdiff_t h = 0; h < plan->kv_heads; h++) {
                const size_t slot =
                    ((size_t)(h * sequence->capacity + sequence->start) + (size_t)r) * (size_t)dim;
                memcpy(sequence->keys + slot, k + (row * plan->kv_heads + h) * dim,
                       (size_t)dim * sizeof(float));
                memcpy(sequence->values + slot, v + h * dim, (size_t)dim * sizeof(float));
            }
        }
        problems[i] = (struct attention_problem){
            .q = q + first * q_size, .keys = sequence->keys, .values = sequence->values,
            .positions = positions + first, .out = attended + first * q_size,
            .rows = sequence->rows, .heads = plan->heads, .kv_heads = plan->kv_heads,
            .capacity = sequence->capacity, .head_dim = dim, .window = plan->window,
            .scale = plan->scale, .tree_paths = sequence->depths ? sequence->tree_paths : NULL,
            .tree_base = sequence->start};
    }
    failed |= run_attention_batch(problems, count);
    failed |= linear(&plan->output, attended, rows, projected);
    if (plan->post_attention_norm)
        rms_norm(projected, rows, width, plan->post_attention_norm, plan->eps, projected);
    add(hidden, projected, out, m * (size_t)width);

    rms_norm(out, rows, width, plan->mlp_norm, plan->eps, normed);
    failed |= linear(&plan->gate_up, normed, rows, gate_up);
    struct rows_problem act = {.x = gate_up, .out = gated, .rows = rows, .width = inner};
    if (plan->activation == ACTIVATION_GELU_TANH) run_gelu_mul(&act);
    else run_silu_mul(&act);
    failed |= linear(&plan->down, gated, rows, projected);
    if (plan->post_mlp_norm)
        rms_norm(projected, rows, width, plan->post_mlp_norm, plan->eps, projected);
    add(out, projected, out, m * (size_t)width);
    free(scratch);
    free(problems);
    return failed ? -1 : 0;
}
