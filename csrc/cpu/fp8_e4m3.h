/* The fp8_e4m3 weight format's blocks as floats (formats.h; exactdraft/formats/fp8_e4m3.py): a
 * float32 scale then 32 float8_e4m3fn codes.
 *
 * Invariant: a code decodes to its exact float32 value by integer arithmetic and one exact
 * subtraction (every e4m3fn value is a float32), and a weight is that value times the block's
 * scale, one float32 multiply rounded to nearest-even: the value the checkpoint's block
 * dequantization gives, at every SIMD level (the decode is the same C at every level, and
 * vf_mul is the IEEE multiply everywhere).
 */
#ifndef EXACTDRAFT_CPU_FP8_E4M3_H
#define EXACTDRAFT_CPU_FP8_E4M3_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float fp8_bits_to_float(uint32_t bits)
{
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* Exponent e (bias 7), mantissa m: normal codes are float32 bits with the exponent rebiased to
 * 127; a subnormal code is m 2^-9 = (2^-6 + m 2^-9) - 2^-6, both terms float32 normals and the
 * difference exact (Sterbenz). S.1111.111 is NaN. */
static inline float e4m3_value(uint8_t code)
{
    const uint32_t exponent = (code >> 3) & 0xFu, mantissa = code & 0x7u;
    const float normal = fp8_bits_to_float(((exponent + 120u) << 23) | (mantissa << 20));
    const float subnormal = fp8_bits_to_float((121u << 23) | (mantissa << 20)) - 0x1p-6f;
    float magnitude = exponent ? normal : subnormal;
    if ((code & 0x7Fu) == 0x7Fu) magnitude = NAN;
    return code & 0x80u ? -magnitude : magnitude;
}

/* The 32 weights of a block, unscaled, into `out`. */
static inline void e4m3_block_values(const uint8_t *block, float out[32])
{
    for (int i = 0; i < 32; i++) out[i] = e4m3_value(block[4 + i]);
}

static inline float e4m3_block_scale(const uint8_t *block)
{
    float scale;
    memcpy(&scale, block, sizeof scale);
    return scale;
}

#endif
