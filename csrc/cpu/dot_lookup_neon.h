/* The lookup formats' primitives (lookup_values.h) for dot_neon.h: one table lookup (vqtbl1q)
 * turns 16 nibble codes into their signed table values, widened to int16 like q8_0's weights,
 * whose products with int8 activations are exact.
 */
#include "lookup_values.h"

static inline void widen_signed(int8x16_t bytes, int16x8_t out[2])
{
    out[0] = vmovl_s8(vget_low_s8(bytes));
    out[1] = vmovl_s8(vget_high_s8(bytes));
}

/* code[j] (activations 4j..4j+3 of the 4 rows): the signed table values, DOT_Q8_CODE_BIAS 0. */
static inline void dot_load_lookup(const int8_t *table, const uint8_t *chunks,
                                   struct dot_codes *w)
{
    const int8x16_t values = vld1q_s8(table);
    for (int t = 0; t < 4; t++) {
        const uint8x16_t bytes = vld1q_u8(chunks + t * DOT_CHUNK);
        widen_signed(vqtbl1q_s8(values, vandq_u8(bytes, vdupq_n_u8(0x0f))), w->code[t]);
        widen_signed(vqtbl1q_s8(values, vshrq_n_u8(bytes, 4)), w->code[t + 4]);
    }
}

#define dot_lookup_rows dot_rows

/* 4 e8m0 bytes as their scales 2^(e - 128). */
static inline dv dv_load_e8m0_half(const uint8_t *p)
{
    const float lanes[4] = {e8m0_half(p[0]), e8m0_half(p[1]), e8m0_half(p[2]), e8m0_half(p[3])};
    return vld1q_f32(lanes);
}

/* 4 int8 values as floats (exact). */
static inline dv dv_load_int8(const int8_t *p)
{
    const int32_t lanes[4] = {p[0], p[1], p[2], p[3]};
    return vcvtq_f32_s32(vld1q_s32(lanes));
}
