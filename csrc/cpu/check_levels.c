/* A standalone cross-check of one SIMD level against the scalar level, for levels this machine
 * cannot run natively (tests/kernels/test_cpu_neon.py builds it for arm64 with the level's
 * object files and runs it under an emulator). It is not part of the Python extension.
 *
 * Invariant checked: the integer-dot path (activation quantization and the dot layout's
 * matmul) gives the same bits on the level as on the scalar level; vf_sum_lanes gives lane k
 * the bits of vf_sum(d[k]); attention agrees with the scalar level to float rounding.
 * Prints one line per check and exits with 0 only if all pass.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__aarch64__)
#include "vec_neon.h"
#define CHECKED kernels_neon
#else
#error "check_levels.c has no level to check on this architecture"
#endif

static float random_float(void) { return (float)rand() / (float)RAND_MAX * 2.0f - 1.0f; }

static int check_sum_lanes(void)
{
    int same = 1;
    for (int trial = 0; trial < 1000; trial++) {
        vf parts[VW];
        float values[VW];
        for (int k = 0; k < VW; k++) {
            for (int i = 0; i < VW; i++) values[i] = random_float() * powf(10.0f, (float)(i % 5));
            parts[k] = vf_load(values);
        }
        float lanes[VW];
        vf_store(lanes, vf_sum_lanes(parts));
        for (int k = 0; k < VW; k++) {
            float one = vf_sum(parts[k]);
            same &= !memcmp(&one, &lanes[k], sizeof one);
        }
    }
    printf("vf_sum_lanes equals vf_sum: %s\n", same ? "yes" : "NO");
    return same;
}

static int check_attention(void)
{
    enum { ROWS = 5, HEADS = 6, KV_HEADS = 2, DIM = 40, CAPACITY = 300 };
    static float q[ROWS * HEADS * DIM], keys[KV_HEADS * CAPACITY * DIM],
        values[KV_HEADS * CAPACITY * DIM], out[2][ROWS * HEADS * DIM];
    for (int i = 0; i < ROWS * HEADS * DIM; i++) q[i] = random_float();
    for (int i = 0; i < KV_HEADS * CAPACITY * DIM; i++) {
        keys[i] = random_float();
        values[i] = random_float();
    }
    const int64_t positions[ROWS] = {0, 17, 64, 150, 299};
    struct attention_problem p = {q, keys, values, positions, out[0], ROWS, HEADS, KV_HEADS,
                                  CAPACITY, DIM, 0, 0.158f};
    CHECKED.attention_groups(&p, 0, ROWS * KV_HEADS);
    p.out = out[1];
    kernels_scalar.attention_groups(&p, 0, ROWS * KV_HEADS);
    double worst = 0;
    for (int i = 0; i < ROWS * HEADS * DIM; i++) worst = fmax(worst, fabs(out[0][i] - out[1][i]));
    printf("attention against the scalar level: max |difference| %g\n", worst);
    return worst < 1e-5;
}

/* Quantize the same rows and multiply the same dot-layout weights on both levels. */
static int check_dot(int format, int rows, int columns, int depth)
{
    const struct kernel_table *levels[2] = {&CHECKED, &kernels_scalar};
    const int blocks = depth / QUANT_BLOCK, groups = (columns + DOT_GROUP - 1) / DOT_GROUP;
    const size_t block_bytes = format == FORMAT_Q4_1 ? 20 : format == FORMAT_Q4_0 ? 18 : 34;
    const size_t record_bytes = DOT_GROUP * block_bytes;
    uint8_t *weight = malloc((size_t)groups * blocks * record_bytes);
    for (size_t i = 0; i < (size_t)groups * blocks * record_bytes; i++) weight[i] = (uint8_t)rand();
    const int halves = format == FORMAT_Q4_1 ? 2 * DOT_GROUP : DOT_GROUP; /* d (and m) */
    for (int record = 0; record < groups * blocks; record++)
        for (int h = 0; h < halves; h++) {
            uint16_t half = (uint16_t)(0x2000 + rand() % 0x1000) | (rand() & 1 ? 0x8000 : 0);
            memcpy(weight + record * record_bytes + 2 * h, &half, sizeof half);
        }
    float *x = malloc(sizeof(float) * rows * depth);
    for (int i = 0; i < rows * depth; i++) x[i] = random_float() * (i % 7 ? 1.0f : 100.0f);
    memset(x, 0, QUANT_BLOCK * sizeof(float)); /* a zero block */
    int8_t *quantized[2];
    float *out[2];
    for (int l = 0; l < 2; l++) {
        const size_t per_block = (size_t)rows * blocks;
        quantized[l] = malloc((size_t)rows * depth);
        float *scales = malloc(sizeof(float) * per_block * 2);
        int32_t *sums = malloc(sizeof(int32_t) * per_block * 2);
        struct quantized_rows q = {quantized[l], scales, scales + per_block, sums,
                                   sums + per_block};
        struct quantize_problem quantize = {x, &q, rows, depth};
        levels[l]->quantize_rows(&quantize, 0, rows);
        const int offset = format == FORMAT_Q4_0   ? 8
                           : format == FORMAT_Q8_0 ? levels[l]->q8_code_bias
                                                   : 0;
        for (size_t i = 0; i < per_block; i++) q.starts[i] = -offset * q.sums[i];
        out[l] = malloc(sizeof(float) * rows * columns);
        struct matmul_problem p = {.x = x, .weight = weight, .out = out[l], .rows = rows,
                                   .depth = depth, .columns = columns, .format = format,
                                   .layout = LAYOUT_DOT, .quantized = &q};
        levels[l]->dot_matmul_columns(&p, 0, columns);
    }
    const int same = !memcmp(quantized[0], quantized[1], (size_t)rows * depth) &&
                     !memcmp(out[0], out[1], sizeof(float) * rows * columns);
    printf("dot format %d, %d x %d x %d: %s\n", format, rows, columns, depth,
           same ? "same bits" : "DIFFERENT");
    return same;
}

int main(void)
{
    int passed = check_sum_lanes();
    passed &= check_attention();
    for (int format = FORMAT_Q8_0; format <= FORMAT_Q4_1; format++) {
        passed &= check_dot(format, 1, 37, 96);
        passed &= check_dot(format, 7, 50, 128);
        passed &= check_dot(format, 13, 16, 64);
    }
    printf("%s\n", passed ? "all checks passed" : "CHECKS FAILED");
    return passed ? 0 : 1;
}
