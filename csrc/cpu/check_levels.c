/* A standalone check that every SIMD level built into it gives the scalar level's bits, for
 * every kernel and for whole decoder layers. It is not part of the Python extension: tests build
 * it with the level objects and run it natively, under qemu (arm64 NEON), or with the x86
 * levels built on SIMDe (EXACTDRAFT_EMULATE_X86) where the CPU lacks their instructions.
 *
 * Invariant checked: the canonical arithmetic (vec_scalar.h): for the same inputs, each level's
 * matmul (every format and layout), attention, rms_norm, rope, gated activations, activation
 * quantization, integer-dot matmul and fused decoder layer produce the same bytes as the scalar
 * level's. The levels only tests select (amx_emulated: the amx level's tile code with the tile
 * instructions computed in C) are checked too. Prints one line per check and exits with 0 only
 * if all pass.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_layer.h"
#include "dispatch.h"
#include "kernels.h"
#include "random_problems.h"

/* The shared generator (random_problems.c), one stream for the whole check. */
static struct random_stream stream = {0x9E3779B97F4A7C15ull};

static unsigned next_random(void) { return random_next(&stream); }
static float random_float(int spread) { return random_stream_float(&stream, spread); }
static float *random_floats(size_t count, int spread)
{
    return random_stream_floats(&stream, count, spread);
}
static uint16_t random_half(void) { return random_stream_half(&stream); }
static uint8_t *random_dot_weights(int format, ptrdiff_t columns, ptrdiff_t depth)
{
    return random_stream_dot_weights(&stream, format, columns, depth);
}

/* `count` rows of K weights in a format, in the rows or grouped layout (both are runs of whole
 * blocks with the header first, so random codes and random half scales make valid weights). */
static uint8_t *random_weights(int format, size_t count, ptrdiff_t depth)
{
    const struct format_row *row = &FORMAT_ROWS[format];
    const size_t blocks = count * (size_t)(depth / row->block_size);
    uint8_t *out = malloc(blocks * (size_t)row->block_bytes);
    for (size_t b = 0; b < blocks; b++) {
        uint8_t *block = out + b * (size_t)row->block_bytes;
        if (format == FORMAT_F32) {
            float value = random_float(0);
            memcpy(block, &value, 4);
        } else if (format == FORMAT_BF16) {
            float value = random_float(0);
            uint32_t bits;
            memcpy(&bits, &value, 4);
            uint16_t top = (uint16_t)(bits >> 16);
            memcpy(block, &top, 2);
        } else if (format == FORMAT_FP8_E4M3) {
            /* A float scale (zero sometimes), then codes of every finite value. */
            float scale = random_float(1);
            memcpy(block, &scale, 4);
            for (int i = 4; i < row->block_bytes; i++) {
                uint8_t code = (uint8_t)next_random();
                block[i] = (code & 0x7F) == 0x7F ? (uint8_t)(code ^ 0x01) : code;
            }
        } else {
            for (int i = 0; i < row->block_bytes; i++) block[i] = (uint8_t)next_random();
            const int halves = format == FORMAT_Q4_1 ? 2 : 1;
            for (int h = 0; h < halves; h++) {
                uint16_t half = random_half();
                memcpy(block + 2 * h, &half, 2);
            }
        }
    }
    return out;
}

/* The level whose integer-dot kernels serve `level` (avx512 borrows avx2's, as dispatch.c). */
static const struct kernel_table *dot_of(const struct kernel_table *level)
{
#if defined(HAVE_X86_LEVELS)
    if (!level->dot_matmul_columns) return &kernels_avx2;
#endif
    return level;
}

static int failures = 0;

static void report(const char *what, const struct kernel_table *level, int same)
{
    printf("%-11s %-54s %s\n", level->name, what, same ? "same bits" : "DIFFERENT");
    failures += !same;
}

static int same_floats(const float *a, const float *b, size_t count)
{
    return !memcmp(a, b, count * sizeof(float));
}

static void check_matmul(const struct kernel_table *level, int format, int layout,
                         ptrdiff_t rows, ptrdiff_t depth, ptrdiff_t columns)
{
    const struct format_row *row = &FORMAT_ROWS[format];
    uint8_t *weight = random_weights(format, (size_t)columns, depth);
    float *x = random_floats((size_t)(rows * depth), 1), *bias = random_floats(columns, 0);
    float *out[2];
    const struct kernel_table *levels[2] = {level, &kernels_scalar};
    for (int l = 0; l < 2; l++) {
        out[l] = malloc(sizeof(float) * (size_t)(rows * columns));
        struct matmul_problem p = {
            .x = x, .weight = weight, .bias = bias, .out = out[l], .rows = rows, .depth = depth,
            .columns = columns, .format = format, .layout = layout,
            .row_bytes = (size_t)(depth / row->block_size) * (size_t)row->block_bytes};
        ptrdiff_t tile = levels[l]->column_tile;
        for (ptrdiff_t n = 0; n < columns; n += 4 * tile) {
            ptrdiff_t end = n + 4 * tile < columns ? n + 4 * tile : columns;
            levels[l]->matmul_columns(&p, n, end);
        }
    }
    char what[96];
    snprintf(what, sizeof what, "matmul %s %s %zd x %zd x %zd", row->name,
             layout == LAYOUT_GROUPED ? "grouped" : "rows", rows, depth, columns);
    report(what, level, same_floats(out[0], out[1], (size_t)(rows * columns)));
    free(weight), free(x), free(bias), free(out[0]), free(out[1]);
}

static void check_dot(const struct kernel_table *level, int format, ptrdiff_t rows,
                      ptrdiff_t columns, ptrdiff_t depth)
{
    const struct kernel_table *levels[2] = {level, &kernels_scalar};
    const ptrdiff_t blocks = depth / QUANT_BLOCK;
    uint8_t *weight = random_dot_weights(format, columns, depth);
    float *x = random_floats((size_t)(rows * depth), 1);
    memset(x, 0, QUANT_BLOCK * sizeof(float)); /* a zero block */
    const size_t per_block = (size_t)(rows * blocks);
    int8_t *values[2];
    float *out[2];
    for (int l = 0; l < 2; l++) {
        const struct kernel_table *dot = dot_of(levels[l]);
        values[l] = malloc((size_t)(rows * depth));
        float *scales = malloc(sizeof(float) * per_block * 2);
        int32_t *sums = malloc(sizeof(int32_t) * per_block * 3);
        struct quantized_rows q = {values[l], scales, scales + per_block, sums, sums + per_block};
        struct quantize_problem quantize = {x, &q, rows, depth};
        dot->quantize_rows(&quantize, 0, rows);
        set_dot_starts(format, dot->q8_code_bias, &q, per_block);
        uint8_t *tables = sign_tables_for(dot, format, &q, per_block);
        out[l] = malloc(sizeof(float) * (size_t)(rows * columns));
        struct matmul_problem p = {.x = x, .weight = weight, .out = out[l], .rows = rows,
                                   .depth = depth, .columns = columns, .format = format,
                                   .layout = LAYOUT_DOT, .quantized = &q};
        dot->dot_matmul_columns(&p, 0, columns);
        free(scales), free(sums), free(tables);
    }
    char what[96];
    snprintf(what, sizeof what, "dot %s %zd x %zd x %zd", FORMAT_ROWS[format].name, rows, depth,
             columns);
    report(what, level, !memcmp(values[0], values[1], (size_t)(rows * depth)) &&
                            same_floats(out[0], out[1], (size_t)(rows * columns)));
    free(weight), free(x), free(values[0]), free(values[1]), free(out[0]), free(out[1]);
}

/* Sink logits of the HEADS = 6 query heads below: inside the scores' range and past it. */
static const float SINKS[6] = {-3.5f, 0.0f, 1.25f, 4.0f, -0.75f, 9.0f};

static void check_attention(const struct kernel_table *level, ptrdiff_t head_dim,
                            ptrdiff_t window, const float *sinks)
{
    enum { ROWS = 5, HEADS = 6, KV_HEADS = 2, CAPACITY = 320 };
    const int64_t positions[ROWS] = {0, 17, 64, 150, 319};
    const size_t q_count = ROWS * HEADS * (size_t)head_dim;
    const size_t kv_count = KV_HEADS * CAPACITY * (size_t)head_dim;
    float *q = random_floats(q_count, 0), *keys = random_floats(kv_count, 0);
    float *values = random_floats(kv_count, 0), *out[2];
    const struct kernel_table *levels[2] = {level, &kernels_scalar};
    for (int l = 0; l < 2; l++) {
        out[l] = malloc(q_count * sizeof(float));
        struct attention_problem p = {q, keys, values, positions, out[l], ROWS, HEADS, KV_HEADS,
                                      CAPACITY, head_dim, window, 0.125f, NULL, 0, sinks};
        levels[l]->attention_groups(&p, ROWS, 0, ROWS * KV_HEADS);
    }
    char what[96];
    snprintf(what, sizeof what, "attention head_dim %zd window %zd%s", head_dim, window,
             sinks ? " sinks" : "");
    report(what, level, same_floats(out[0], out[1], q_count));
    free(q), free(keys), free(values), free(out[0]), free(out[1]);
}

/* A token tree of 5 rows at base 254 (parents -1, 0, 0, 1, 2), so rows cross the key tile at
 * 256 and read ancestors' keys from slots other than their positions. */
static void check_tree_attention(const struct kernel_table *level, ptrdiff_t head_dim,
                                 const float *sinks)
{
    enum { ROWS = 5, HEADS = 6, KV_HEADS = 2, CAPACITY = 320, BASE = 254 };
    const int64_t positions[ROWS] = {BASE, BASE + 1, BASE + 1, BASE + 2, BASE + 2};
    const int32_t paths[ROWS * ROWS] = {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0,
                                        0, 1, 3, 0, 0, 0, 2, 4, 0, 0};
    const size_t q_count = ROWS * HEADS * (size_t)head_dim;
    const size_t kv_count = KV_HEADS * CAPACITY * (size_t)head_dim;
    float *q = random_floats(q_count, 0), *keys = random_floats(kv_count, 0);
    float *values = random_floats(kv_count, 0), *out[2];
    const struct kernel_table *levels[2] = {level, &kernels_scalar};
    for (int l = 0; l < 2; l++) {
        out[l] = malloc(q_count * sizeof(float));
        struct attention_problem p = {q, keys, values, positions, out[l], ROWS, HEADS, KV_HEADS,
                                      CAPACITY, head_dim, 0, 0.125f, paths, BASE, sinks};
        levels[l]->attention_groups(&p, ROWS, 0, ROWS * KV_HEADS);
    }
    char what[96];
    snprintf(what, sizeof what, "tree attention head_dim %zd%s", head_dim,
             sinks ? " sinks" : "");
    report(what, level, same_floats(out[0], out[1], q_count));
    free(q), free(keys), free(values), free(out[0]), free(out[1]);
}

static void check_rows(const struct kernel_table *level, ptrdiff_t width)
{
    enum { ROWS = 3, HEADS = 2 };
    const struct kernel_table *levels[2] = {level, &kernels_scalar};
    const char *names[4] = {"rms_norm", "rope", "silu_mul", "gelu_mul"};
    for (int op = 0; op < 4; op++) {
        /* rms_norm [M, width]; rope [M, HEADS, 2 width]; gated [M, 2 width] -> [M, width] */
        const size_t in_count = (size_t)(ROWS * width) * (op == 1 ? 2 * HEADS : op >= 2 ? 2 : 1);
        float *x = random_floats(in_count, 1);
        for (size_t i = 0; i < in_count; i += 7) x[i] *= 40.0f; /* the activations' tails */
        float *weight = random_floats((size_t)(ROWS * width), 0);
        float *weight2 = random_floats((size_t)(ROWS * width), 0), *out[2];
        for (int l = 0; l < 2; l++) {
            out[l] = malloc(in_count * sizeof(float));
            struct rows_problem p = {x, weight, weight2, out[l], ROWS, width, HEADS, 1e-6f};
            if (op == 0) levels[l]->rms_norm_rows(&p, 0, ROWS);
            else if (op == 1) {
                p.width = 2 * width; /* head_dim: cos and sin have width entries per row */
                levels[l]->rope_rows(&p, 0, ROWS);
            } else if (op == 2) levels[l]->silu_mul_rows(&p, 0, ROWS);
            else levels[l]->gelu_mul_rows(&p, 0, ROWS);
        }
        const size_t out_count = op >= 2 ? (size_t)(ROWS * width) : in_count;
        char what[96];
        snprintf(what, sizeof what, "%s width %zd", names[op], width);
        report(what, level, same_floats(out[0], out[1], out_count));
        free(x), free(weight), free(weight2), free(out[0]), free(out[1]);
    }
}

/* Two fused decoder layers in a row over a prompt and a verify window, with the dispatcher's
 * threads, compared with the scalar level's. */
static void check_layers(const struct kernel_table *level, int format, int layout, int qk_norm,
                         int sandwich, int activation)
{
    enum { HIDDEN = 64, HEADS = 4, KV_HEADS = 2, DIM = 16, INNER = 96, CAPACITY = 128 };
    const int rows_per_pass[2] = {37, 5};
    struct layer_weight weights[4];
    const ptrdiff_t shapes[4][2] = {{HEADS * DIM + 2 * KV_HEADS * DIM, HIDDEN},
                                    {HIDDEN, HEADS * DIM}, {2 * INNER, HIDDEN}, {HIDDEN, INNER}};
    void *owned[32];
    int owned_count = 0;
    for (int w = 0; w < 4; w++) {
        const struct format_row *row = &FORMAT_ROWS[format];
        uint8_t *data = layout == LAYOUT_DOT ? random_dot_weights(format, shapes[w][0], shapes[w][1])
                                             : random_weights(format, (size_t)shapes[w][0],
                                                              shapes[w][1]);
        owned[owned_count++] = data;
        weights[w] = (struct layer_weight){
            .columns = shapes[w][0], .depth = shapes[w][1], .parts = 1,
            .part = {{.data = data, .bias = NULL, .columns = shapes[w][0],
                      .row_bytes = (size_t)(shapes[w][1] / row->block_size) *
                                   (size_t)row->block_bytes,
                      .format = format, .layout = layout}}};
    }
    float *norms[6];
    for (int i = 0; i < 6; i++) {
        norms[i] = random_floats(HIDDEN, 0);
        for (int j = 0; j < HIDDEN; j++) norms[i][j] += 1.5f;
        owned[owned_count++] = norms[i];
    }
    struct layer_plan plan = {
        .hidden_size = HIDDEN, .heads = HEADS, .kv_heads = KV_HEADS, .head_dim = DIM,
        .intermediate = INNER, .window = 24, .eps = 1e-6f, .scale = 0.25f,
        .activation = activation, .attention_norm = norms[0], .mlp_norm = norms[1],
        .q_norm = qk_norm ? norms[2] : NULL, .k_norm = qk_norm ? norms[3] : NULL,
        .post_attention_norm = sandwich ? norms[4] : NULL,
        .post_mlp_norm = sandwich ? norms[5] : NULL,
        .qkv = weights[0], .output = weights[1], .gate_up = weights[2], .down = weights[3]};
    const int total = rows_per_pass[0] + rows_per_pass[1];
    float *hidden = random_floats((size_t)total * HIDDEN, 0);
    float *cos = random_floats((size_t)total * DIM / 2, 0), *sin = random_floats(
        (size_t)total * DIM / 2, 0);
    float *out[2];
    const char *names[2] = {level->name, "scalar"};
    for (int l = 0; l < 2; l++) {
        select_level(names[l]);
        float *keys = calloc(KV_HEADS * CAPACITY * DIM, sizeof(float));
        float *values = calloc(KV_HEADS * CAPACITY * DIM, sizeof(float));
        out[l] = malloc(sizeof(float) * (size_t)total * HIDDEN);
        float *step = malloc(sizeof(float) * (size_t)total * HIDDEN);
        for (int pass = 0, start = 0; pass < 2; start += rows_per_pass[pass++]) {
            const int rows = rows_per_pass[pass];
            const struct layer_sequence sequence = {keys, values, CAPACITY, start, rows};
            run_decoder_layer(&plan, hidden + start * HIDDEN, step, &sequence, 1,
                              cos + start * DIM / 2, sin + start * DIM / 2);
            run_decoder_layer(&plan, step, out[l] + start * HIDDEN, &sequence, 1,
                              cos + start * DIM / 2, sin + start * DIM / 2);
        }
        free(keys), free(values), free(step);
    }
    char what[96];
    snprintf(what, sizeof what, "layers %s %s%s%s%s", FORMAT_ROWS[format].name,
             layout == LAYOUT_DOT ? "dot" : layout == LAYOUT_GROUPED ? "grouped" : "rows",
             qk_norm ? " qk-norm" : "", sandwich ? " sandwich" : "", activation ? " gelu" : "");
    report(what, level, same_floats(out[0], out[1], (size_t)total * HIDDEN));
    for (int i = 0; i < owned_count; i++) free(owned[i]);
    free(hidden), free(cos), free(sin), free(out[0]), free(out[1]);
}

static void check_level(const struct kernel_table *level)
{
    const ptrdiff_t row_counts[3] = {1, 5, 9};
    for (int format = 0; format < FORMAT_COUNT; format++) {
        const int dense = FORMAT_ROWS[format].block_size == 1;
        if (FORMAT_ROWS[format].float_kernel)
            for (int layout = LAYOUT_ROWS; layout <= LAYOUT_GROUPED; layout++)
                for (int r = 0; r < 3; r++)
                    check_matmul(level, format, layout, row_counts[r],
                                 dense && !layout ? 100 : 96, 37);
        if (FORMAT_ROWS[format].dot_record_bytes) {
            check_dot(level, format, 1, 37, 256);
            check_dot(level, format, 7, 50, 512);
            check_dot(level, format, 13, 16, 256);
            /* q1_0's lookup: four groups at a time, then a partial fourth group. */
            if (format == FORMAT_Q1_0) check_dot(level, format, 1, 121, 256);
        }
    }
    const ptrdiff_t head_dims[4] = {40, 64, 128, 256};
    for (int d = 0; d < 4; d++) {
        check_attention(level, head_dims[d], 0, NULL);
        check_attention(level, head_dims[d], 17, NULL);
        check_tree_attention(level, head_dims[d], NULL);
        check_attention(level, head_dims[d], 0, SINKS);
        check_attention(level, head_dims[d], 17, SINKS);
        check_tree_attention(level, head_dims[d], SINKS);
    }
    check_rows(level, 7);
    check_rows(level, 100);
    check_layers(level, FORMAT_F32, LAYOUT_GROUPED, 0, 0, 0);
    check_layers(level, FORMAT_BF16, LAYOUT_ROWS, 1, 1, 1);
    check_layers(level, FORMAT_Q4_1, LAYOUT_DOT, 1, 0, 0);
    check_layers(level, FORMAT_Q8_0, LAYOUT_GROUPED, 0, 1, 1);
    check_layers(level, FORMAT_Q5_0, LAYOUT_DOT, 1, 1, 1);
    /* The super-block formats (q6_k, ...) need K in multiples of 256, wider than this layer:
     * their records are checked by check_dot; the table lookup's path is checked here. */
    check_layers(level, FORMAT_IQ4_NL, LAYOUT_DOT, 0, 0, 0);
    check_layers(level, FORMAT_FP8_E4M3, LAYOUT_GROUPED, 1, 0, 0);
}

int main(void)
{
    const struct kernel_table *levels[8];
    int count = supported_levels(levels, 8);
    count += test_levels(levels + count, 8 - count);
    int checked = 0;
    for (int i = 0; i < count; i++)
        if (levels[i] != &kernels_scalar) {
            check_level(levels[i]);
            checked++;
        }
    printf("%s (%d levels against scalar)\n", failures ? "CHECKS FAILED" : "all checks passed",
           checked);
    return failures ? 1 : 0;
}
