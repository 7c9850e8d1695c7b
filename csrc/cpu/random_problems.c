/* Reproducible random inputs for the kernels; see random_problems.h. */
#include "random_problems.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dot_layout.h"
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
    uint8_t *weight = malloc((size_t)(groups * blocks) * record_bytes);
    if (!weight) return NULL;
    if (format == FORMAT_Q2_K || format == FORMAT_Q3_K)
        return random_k_low_records(s, format, weight, groups * blocks * (ptrdiff_t)record_bytes);
    /* Random codes and sub-scales (every bit pattern is a valid one), then random float16
     * parameters in each record's (or shared record's) header. */
    const size_t bytes = (size_t)(groups * blocks) * record_bytes;
    for (size_t i = 0; i < bytes; i++) weight[i] = (uint8_t)random_next(s);
    const size_t shared_bytes = (size_t)SHARED_BLOCKS(format) * record_bytes;
    for (size_t at = 0; at < bytes; at += shared_bytes) {
        if (format == FORMAT_MXFP4) { /* e8m0 exponents: scales 2^-16 .. 2^15 */
            for (int h = 0; h < DOT_GROUP; h++)
                weight[at + h] = (uint8_t)(112 + random_next(s) % 32);
            continue;
        }
        for (int h = 0; h < PARAMETER_BYTES(format) / 2; h++) {
            /* A super-block's d multiplies integer sub-scales: 256 times smaller, with
             * sub-scales below 16, keeps the weights in the range of the other formats'. */
            const uint16_t half = (uint16_t)(random_stream_half(s) -
                                             (SUPER_HEADER(format) ? 8 << 10 : 0));
            memcpy(weight + at + 2 * h, &half, sizeof half);
        }
        for (int b = 0; b < SHARED_BLOCKS(format) && SUPER_HEADER(format); b++) {
            uint8_t *sub_scales = weight + at + PARAMETER_BYTES(format) +
                                  (size_t)b * SHARED_CODE_BYTES(format);
            for (int i = 0; i < SUB_SCALE_BYTES(format); i++) sub_scales[i] &= 15;
        }
    }
    return weight;
}
