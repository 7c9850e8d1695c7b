/* The fp8_e4m3 weight format's blocks as floats (formats.h; exactdraft/formats/fp8_e4m3.py): a
 * float32 scale then 32 float8_e4m3fn codes.
 *
 * Invariant: a code decodes to its exact float32 value by integer arithmetic, or an exact
 * int-to-float conversion and power-of-two scaling (every e4m3fn value is a float32), and a
 * weight is that value times the block's scale, one float32 multiply rounded to nearest-even:
 * the value the checkpoint's block dequantization gives, at every SIMD level (the decode is the
 * same C at every level, and vf_mul is the IEEE multiply everywhere).
 */
#ifndef EXACTDRAFT_CPU_FP8_E4M3_H
#define EXACTDRAFT_CPU_FP8_E4M3_H

#include <stdint.h>
#include <string.h>

/* The 32 weights of a block, unscaled, into `out`. A code of exponent e (bias 7) and mantissa m
 * is normal for e > 0: its float32 bits are the same sign, the exponent rebiased to 127 and the
 * mantissa at the top, which is its magnitude bits shifted up plus 120 in the exponent field;
 * for e = 0 it is m 2^-9, an int converted exactly and scaled by a power of two. S.1111.111 is
 * NaN (its bits OR the quiet NaN's are a NaN). Written with masks, not branches, so that
 * compilers turn the loop into vector code. */
static inline void e4m3_block_values(const uint8_t *block, float out[32])
{
    uint32_t bits[32];
    for (int i = 0; i < 32; i++) {
        const uint32_t code = block[4 + i], magnitude = code & 0x7Fu;
        const float small = (float)(int32_t)magnitude * 0x1p-9f; /* right for magnitude < 8 */
        uint32_t small_bits;
        memcpy(&small_bits, &small, sizeof small_bits);
        const uint32_t normal_bits = (magnitude << 20) + (120u << 23);
        const uint32_t small_mask = 0u - (uint32_t)(magnitude < 8u);
        const uint32_t nan_mask = 0u - (uint32_t)(magnitude == 0x7Fu);
        const uint32_t value = (small_bits & small_mask) | (normal_bits & ~small_mask);
        bits[i] = (value | (0x7FC00000u & nan_mask)) | (code & 0x80u) << 24;
    }
    memcpy(out, bits, sizeof bits);
}

static inline float e4m3_block_scale(const uint8_t *block)
{
    float scale;
    memcpy(&scale, block, sizeof scale);
    return scale;
}

#endif
