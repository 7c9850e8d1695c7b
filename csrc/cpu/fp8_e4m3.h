/* The fp8_e4m3 weight format's blocks as floats (formats.h; exactdraft/formats/fp8_e4m3.py): a
 * float32 scale then 32 float8_e4m3fn codes.
 *
 * Invariant: a code decodes to its exact float32 value (every e4m3fn value is a float32) by
 * integer arithmetic and, for the codes of exponent 0, two exact float operations, and a weight
 * is that value times the block's scale, one float32 multiply rounded to nearest-even: the value
 * the checkpoint's block dequantization gives, at every SIMD level (the decode is the same C and
 * vf operations at every level, each an IEEE operation there).
 */
#ifndef EXACTDRAFT_CPU_FP8_E4M3_H
#define EXACTDRAFT_CPU_FP8_E4M3_H

#include <stdint.h>
#include <string.h>

/* Every e4m3fn value is a bfloat16 (3 mantissa bits, exponents 2^-9 .. 2^8). The bfloat16 bits of
 * each code of a block, as if every code were normal: the same sign, the magnitude bits shifted
 * up by 4 and 120 added to the exponent field (exponent e of bias 7 becomes e + 120 of bias
 * 127). That is the code's value for exponents 1 .. 15; a code of exponent 0 comes out as
 * 2^-7 (1 + m / 8) instead of m 2^-9, which decode_block (kernel_body.h) corrects in floats.
 * S.1111.111 becomes bfloat16's quiet NaN. Written with masks, not branches, so that compilers
 * turn the loop into vector code (16-bit lanes). */
static inline void e4m3_block_halves(const uint8_t *block, uint16_t out[32])
{
    for (int i = 0; i < 32; i++) {
        const uint16_t code = block[4 + i], magnitude = code & 0x7Fu;
        const uint16_t normal = (uint16_t)(((code & 0x80u) << 8) | ((magnitude << 4) + 0x3C00u));
        const uint16_t nan_mask = (uint16_t)(0u - (uint16_t)(magnitude == 0x7Fu));
        out[i] = (uint16_t)((normal & ~nan_mask) | (0x7FC0u & nan_mask));
    }
}

static inline float e4m3_block_scale(const uint8_t *block)
{
    float scale;
    memcpy(&scale, block, sizeof scale);
    return scale;
}

#endif
