/* Reproducible random inputs for the kernels; see random_problems.h. */
#include "random_problems.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

unsigned random_next(struct random_stream *s)
{
    s->state = s->state * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(s->state >> 33);
}

float random_stream_float(struct random_stream *s, int spread)
{
    float value = (float)(random_next(s) % 2000001) / 1000000.0f - 1.0f;
    if (spread) value = ldexpf(value, (int)(random_next(s) % 21) - 10);
    return value;
}

float *random_stream_floats(struct random_stream *s, size_t count, int spread)
{
    float *out = malloc(count * sizeof(float));
    if (out)
        for (size_t i = 0; i < count; i++) out[i] = random_stream_float(s, spread);
    return out;
}

uint16_t random_stream_half(struct random_stream *s)
{
    const unsigned magnitude = 0x2400 + random_next(s) % 0x1400;
    return (uint16_t)(magnitude | (random_next(s) & 1 ? 0x8000 : 0));
}

/* q2_k and q3_k's super-block records (csrc/cpu/dot_k_low.h): random codes and sub-scales
 * (q3_k's in -32..31, as their 6 bits give) and random float16 headers. */
static uint8_t *random_k_low_records(struct random_stream *s, int format, uint8_t *weight,
                                     ptrdiff_t bytes)
{
    const int q2 = format == FORMAT_Q2_K;
    const ptrdiff_t super_bytes = 8 * (ptrdiff_t)FORMAT_ROWS[format].dot_record_bytes;
    const int header = (q2 ? 4 : 2) * DOT_GROUP, block_bytes = 2 * DOT_GROUP +
                                                                (q2 ? 2 : 3) * DOT_CHUNK;
    for (ptrdiff_t i = 0; i < bytes; i++) weight[i] = (uint8_t)random_next(s);
    for (ptrdiff_t at = 0; at < bytes; at += super_bytes) {
        for (int h = 0; h < header / 2; h++) {
            const uint16_t half = random_stream_half(s);
            memcpy(weight + at + 2 * h, &half, sizeof half);
        }
        for (int b = 0; b < 8 && !q2; b++)
            for (int i = 0; i < 2 * DOT_GROUP; i++) {
                uint8_t *scale = weight + at + header + b * block_bytes + i;
                *scale = (uint8_t)(int8_t)((*scale & 63) - 32);
            }
    }
    return weight;
}

uint8_t *random_stream_dot_weights(struct random_stream *s, int format, ptrdiff_t columns,
                                   ptrdiff_t depth)
{
    const ptrdiff_t blocks = depth / QUANT_BLOCK, groups = (columns + DOT_GROUP - 1) / DOT_GROUP;
    const size_t record_bytes = (size_t)FORMAT_ROWS[format].dot_record_bytes;
    const int float_parameters = format == FORMAT_Q4_K || format == FORMAT_Q5_K ||
                                 format == FORMAT_Q6_K;
    const int parameters = (format == FORMAT_Q4_1 || format == FORMAT_Q5_1 || float_parameters
                                ? 2
                                : 1) * DOT_GROUP;
    const size_t parameter_bytes = (size_t)parameters * (float_parameters ? 4 : 2);
    const unsigned code_mask = format == FORMAT_Q6_K ? 63 : (format == FORMAT_Q5_0 ||
                                                             format == FORMAT_Q5_1 ||
                                                             format == FORMAT_Q5_K) ? 31 : 255;
    uint8_t *weight = malloc((size_t)(groups * blocks) * record_bytes);
    if (!weight) return NULL;
    if (format == FORMAT_Q2_K || format == FORMAT_Q3_K)
        return random_k_low_records(s, format, weight, groups * blocks * (ptrdiff_t)record_bytes);
    for (ptrdiff_t record = 0; record < groups * blocks; record++) {
        uint8_t *at = weight + (size_t)record * record_bytes;
        for (int h = 0; h < parameters; h++) {
            if (float_parameters) {
                float value = ldexpf(random_stream_float(s, 0), -6);
                memcpy(at + 4 * h, &value, sizeof value);
            } else {
                uint16_t half = random_stream_half(s);
                memcpy(at + 2 * h, &half, sizeof half);
            }
        }
        for (size_t i = parameter_bytes; i < record_bytes; i++)
            at[i] = (uint8_t)(random_next(s) & code_mask);
        if (format == FORMAT_MXFP4) /* e8m0 exponents: scales 2^-16 .. 2^15 */
            for (int h = 0; h < DOT_GROUP; h++) at[h] = (uint8_t)(112 + random_next(s) % 32);
    }
    return weight;
}
