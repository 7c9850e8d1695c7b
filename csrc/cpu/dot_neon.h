/* Integer dot products for the dot layout on arm64 NEON, for dot_body.h: 4 weight rows per
 * vector, one int32 lane each.
 *
 * Invariant: every primitive returns exact integer sums: codes and activations are widened to
 * int16, whose products (at most 128 * 127) are exact, and pairs of products are added into
 * int32 lanes.
 */
#include "kernels.h"
#include <arm_neon.h>
#include <string.h>

#define DOT_TILE_ROWS 4
#define DOT_Q8_CODE_BIAS 0
#define DOT_VW 4

typedef int32x4_t vi;
typedef float32x4_t dv; /* one weight row per lane */

/* One block's weight codes for 4 rows as int16: code[j][0] holds rows 0 and 1 (4 codes each),
 * code[j][1] rows 2 and 3; code[j] pairs with activations 4j..4j+3. */
struct dot_codes {
    int16x8_t code[8][2];
};

static inline vi vi_set1(int32_t a) { return vdupq_n_s32(a); }
static inline dv vi_to_dv(vi a) { return vcvtq_f32_s32(a); }
static inline dv dv_zero(void) { return vdupq_n_f32(0.0f); }
static inline dv dv_set1(float a) { return vdupq_n_f32(a); }
static inline dv dv_add(dv a, dv b) { return vaddq_f32(a, b); }
static inline dv dv_mul(dv a, dv b) { return vmulq_f32(a, b); }
static inline void dv_store(float *p, dv v) { vst1q_f32(p, v); }
static inline dv dv_load(const float *p) { return vld1q_f32(p); }

static inline dv dv_load_half(const uint16_t *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static inline void widen_unsigned(uint8x16_t bytes, int16x8_t out[2])
{
    out[0] = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(bytes)));
    out[1] = vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(bytes)));
}

static inline void dot_load_q4(const uint8_t *chunks, struct dot_codes *w)
{
    for (int t = 0; t < 4; t++) {
        uint8x16_t bytes = vld1q_u8(chunks + t * DOT_CHUNK);
        widen_unsigned(vandq_u8(bytes, vdupq_n_u8(0x0f)), w->code[t]);
        widen_unsigned(vshrq_n_u8(bytes, 4), w->code[t + 4]);
    }
}

/* Unsigned byte codes as stored. */
static inline void dot_load_u8(const uint8_t *chunks, struct dot_codes *w)
{
    for (int j = 0; j < 8; j++) widen_unsigned(vld1q_u8(chunks + j * DOT_CHUNK), w->code[j]);
}

/* 2-bit codes (dot_record.h's crumbs): chunk t (0, 1) holds per row 4 bytes whose bits
 * 2s..2s+1 are the codes paired with activations 8s+4t..; they widen as codes 0..3. */
static inline void dot_load_crumbs(const uint8_t *chunks, struct dot_codes *w)
{
    const uint8x16_t mask = vdupq_n_u8(3);
    for (int t = 0; t < 2; t++) {
        const uint8x16_t bytes = vld1q_u8(chunks + t * DOT_CHUNK);
        widen_unsigned(vandq_u8(bytes, mask), w->code[t]);
        widen_unsigned(vandq_u8(vshrq_n_u8(bytes, 2), mask), w->code[t + 2]);
        widen_unsigned(vandq_u8(vshrq_n_u8(bytes, 4), mask), w->code[t + 4]);
        widen_unsigned(vshrq_n_u8(bytes, 6), w->code[t + 6]);
    }
}

/* tq1_0: chunk j's codes from a chunk of bytes of five trits (dot_record.h's dot_load_trits):
 * ((v * power mod 256) * 3) >> 8 of each byte v, widened. */
static inline void dot_trit_chunk(const uint8_t *chunk, int power, int j, struct dot_codes *w)
{
    const uint8x16_t shifted = vmulq_u8(vld1q_u8(chunk), vdupq_n_u8((uint8_t)power));
    w->code[j][0] = vreinterpretq_s16_u16(
        vshrq_n_u16(vmulq_n_u16(vmovl_u8(vget_low_u8(shifted)), 3), 8));
    w->code[j][1] = vreinterpretq_s16_u16(
        vshrq_n_u16(vmulq_n_u16(vmovl_u8(vget_high_u8(shifted)), 3), 8));
}

/* q2_k and q3_k's codes (dot_k_low.h's layout), widened straight from the record: code
 * j = 4p + t is bits 2t..2t+1 of 2-bit chunk p's bytes, plus, for q3_k, bit j of the high-bit
 * chunk's moved to bit 2. */
#define DOT_K_LOW_PRIMITIVES
static inline void dot_load_k_low(const int format, const uint8_t *chunks, struct dot_codes *w)
{
    const uint8x16_t low_bits = vdupq_n_u8(3), bit2 = vdupq_n_u8(4);
    const uint8x16_t high = format == FORMAT_Q3_K ? vld1q_u8(chunks + 2 * DOT_CHUNK)
                                                  : vdupq_n_u8(0);
    for (int p = 0; p < 2; p++) {
        const uint8x16_t bytes = vld1q_u8(chunks + p * DOT_CHUNK);
        for (int t = 0; t < 4; t++) {
            const int j = 4 * p + t;
            uint8x16_t code = vandq_u8(vshlq_u8(bytes, vdupq_n_s8((int8_t)(-2 * t))), low_bits);
            if (format == FORMAT_Q3_K)
                code = vorrq_u8(code, vandq_u8(vshlq_u8(high, vdupq_n_s8((int8_t)(2 - j))), bit2));
            widen_unsigned(code, w->code[j]);
        }
    }
}

/* Row lanes' byte parameters as int32 lanes: the low (shift 0) or high (4) nibble, or the
 * signed byte. */
static inline uint8x8_t four_bytes(const uint8_t *p)
{
    uint32_t four;
    memcpy(&four, p, sizeof four);
    return vreinterpret_u8_u32(vdup_n_u32(four));
}
static inline vi vi_lanes_nibble(const uint8_t *p, int shift)
{
    const uint32x4_t bytes = vmovl_u16(vget_low_u16(vmovl_u8(four_bytes(p))));
    return vreinterpretq_s32_u32(shift ? vshrq_n_u32(bytes, 4)
                                       : vandq_u32(bytes, vdupq_n_u32(15)));
}
static inline vi vi_lanes_int8(const uint8_t *p)
{
    return vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(four_bytes(p)))));
}

/* q1_0's bits: bit s of a row's byte i pairs with activation 4s + i; it widens as 2 * bit. */
static inline void dot_load_signs(const uint8_t *chunks, struct dot_codes *w)
{
    const uint8x16_t bytes = vld1q_u8(chunks), two = vdupq_n_u8(2);
    for (int s = 0; s < 8; s++)
        widen_unsigned(vandq_u8(vshlq_u8(bytes, vdupq_n_s8((int8_t)(1 - s))), two), w->code[s]);
}

static inline void dot_load_q8(const uint8_t *chunks, struct dot_codes *w)
{
    for (int j = 0; j < 8; j++) {
        int8x16_t weights = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(chunks + j * DOT_CHUNK),
                                                         vdupq_n_u8(0x80)));
        w->code[j][0] = vmovl_s8(vget_low_s8(weights));
        w->code[j][1] = vmovl_s8(vget_high_s8(weights));
    }
}

/* The sum over chunks [from, to) of code * x. */
static inline vi dot_codes_sum(const struct dot_codes *w, const int8_t *x, int from, int to)
{
    int32x4_t low = vdupq_n_s32(0), high = vdupq_n_s32(0);
    for (int j = from; j < to; j++) {
        uint32_t four;
        memcpy(&four, x + 4 * j, sizeof four);
        int16x8_t xs = vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(four)));
        low = vpadalq_s16(low, vmulq_s16(w->code[j][0], xs));
        high = vpadalq_s16(high, vmulq_s16(w->code[j][1], xs));
    }
    return vpaddq_s32(low, high);
}

/* isum[r] = starts[2 r] + the sum over the block of code * x_r, row r's activations at
 * x + 32 r; q4 codes are 0..15, q8_0 codes the signed weights, byte codes unsigned. */
static inline void dot_rows(const struct dot_codes *w, const int8_t *x, const int32_t *starts,
                            const int rows, vi *isum)
{
    for (int r = 0; r < rows; r++)
        isum[r] = vaddq_s32(vdupq_n_s32(start_at(starts, 2 * r)),
                            dot_codes_sum(w, x + 32 * r, 0, 8));
}

/* As dot_rows over activations 0..15 (isum0) and 16..31 (isum1). */
static inline void dot_u8_halves(const struct dot_codes *w, const int8_t *x,
                                 const int32_t *starts, const int rows, vi *isum0, vi *isum1)
{
    for (int r = 0; r < rows; r++) {
        const int8_t *row = x + 32 * r;
        isum0[r] = vaddq_s32(vdupq_n_s32(start_at(starts, 2 * r)), dot_codes_sum(w, row, 0, 4));
        isum1[r] = vaddq_s32(vdupq_n_s32(start_at(starts, 2 * r + 1)),
                             dot_codes_sum(w, row, 4, 8));
    }
}

/* Lanewise int32 steps for the q2_k and q3_k sub-scales (dot_k_low.h); all exact. */
static inline vi vi_lanes_load(const int32_t *p) { return vld1q_s32(p); }
static inline vi vi_lanes_mul(vi a, vi b) { return vmulq_s32(a, b); }
static inline vi vi_lanes_add(vi a, vi b) { return vaddq_s32(a, b); }

#define dot_q4_rows dot_rows
#define dot_q8_rows dot_rows
#define dot_u8_rows dot_rows

#include "dot_lookup_neon.h"
