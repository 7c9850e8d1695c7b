/* 4-lane float vectors on arm64 NEON, for kernel_body.h.
 *
 * Invariant: each primitive is one fixed sequence of IEEE operations; horizontal reductions use
 * a fixed pairing tree, so a reduction's bits depend only on the lane values.
 */
#include <arm_neon.h>
#include <string.h>

#define VW 4
#define TILE_ROWS 4
/* Vector registers attention may fill with one head's accumulators, side by side. */
#define ATTENTION_REGISTERS 16
#define TILE_COLUMNS 4

typedef float32x4_t vf;

static inline vf vf_zero(void) { return vdupq_n_f32(0.0f); }
static inline vf vf_set1(float a) { return vdupq_n_f32(a); }
static inline vf vf_load(const float *p) { return vld1q_f32(p); }
static inline void vf_store(float *p, vf v) { vst1q_f32(p, v); }
static inline vf vf_load_partial(const float *p, int n)
{
    float lanes[VW] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(lanes, p, (size_t)n * sizeof(float));
    return vld1q_f32(lanes);
}
static inline void vf_store_partial(float *p, vf v, int n)
{
    float lanes[VW];
    vst1q_f32(lanes, v);
    memcpy(p, lanes, (size_t)n * sizeof(float));
}
static inline vf vf_add(vf a, vf b) { return vaddq_f32(a, b); }
static inline vf vf_sub(vf a, vf b) { return vsubq_f32(a, b); }
static inline vf vf_mul(vf a, vf b) { return vmulq_f32(a, b); }
static inline vf vf_div(vf a, vf b) { return vdivq_f32(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
static inline vf vf_max(vf a, vf b) { return vmaxq_f32(a, b); }
static inline vf vf_min(vf a, vf b) { return vminq_f32(a, b); }

static inline vf vf_abs(vf a) { return vabsq_f32(a); }

/* Store the 4 lanes, integral values in [-127, 127], as int8. */
static inline void vf_store_int8(int8_t *p, vf v)
{
    int16x4_t narrow = vmovn_s32(vcvtq_s32_f32(v));
    int8x8_t bytes = vmovn_s16(vcombine_s16(narrow, narrow));
    vst1_lane_s32((int32_t *)(void *)p, vreinterpret_s32_s8(bytes), 0);
}

static inline float vf_sum(vf v)
{
    float32x2_t two = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    return vget_lane_f32(two, 0) + vget_lane_f32(two, 1);
}

/* Lane k of the result is vf_sum(d[k]), bit for bit: halves, then neighbours, as vf_sum adds. */
static inline vf vf_sum_lanes(const vf d[VW])
{
    vf first = vaddq_f32(vcombine_f32(vget_low_f32(d[0]), vget_low_f32(d[1])),
                         vcombine_f32(vget_high_f32(d[0]), vget_high_f32(d[1])));
    vf second = vaddq_f32(vcombine_f32(vget_low_f32(d[2]), vget_low_f32(d[3])),
                          vcombine_f32(vget_high_f32(d[2]), vget_high_f32(d[3])));
    return vpaddq_f32(first, second);
}

static inline float vf_max_all(vf v)
{
    float32x2_t two = vmax_f32(vget_low_f32(v), vget_high_f32(v));
    float a = vget_lane_f32(two, 0), b = vget_lane_f32(two, 1);
    return a > b ? a : b;
}

static inline vf vf_select_greater(vf a, vf b, vf t, vf f)
{
    return vbslq_f32(vcgtq_f32(a, b), t, f);
}

static inline vf vf_select_nan(vf a, vf t, vf f)
{
    return vbslq_f32(vceqq_f32(a, a), f, t);
}

static inline vf vf_pow2n(vf n)
{
    int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vreinterpretq_f32_s32(bits);
}

static inline vf vf_round(vf a) { return vrndnq_f32(a); }

static inline vf vf_load_bf16(const uint16_t *p)
{
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}

/* 32 GGUF q4 weights nibble * scale + bias (exact product, one rounding): element i is the
 * low nibble of byte i, element i + 16 the high nibble. */
static inline void vf_decode_q4(const uint8_t *packed, vf scale, vf bias, vf out[32 / VW])
{
    uint8x16_t bytes = vld1q_u8(packed);
    uint8x16_t halves[2] = {vandq_u8(bytes, vdupq_n_u8(0x0f)), vshrq_n_u8(bytes, 4)};
    for (int h = 0; h < 2; h++) {
        uint16x8_t low = vmovl_u8(vget_low_u8(halves[h]));
        uint16x8_t high = vmovl_u8(vget_high_u8(halves[h]));
        out[4 * h + 0] = vfmaq_f32(bias, vcvtq_f32_u32(vmovl_u16(vget_low_u16(low))), scale);
        out[4 * h + 1] = vfmaq_f32(bias, vcvtq_f32_u32(vmovl_u16(vget_high_u16(low))), scale);
        out[4 * h + 2] = vfmaq_f32(bias, vcvtq_f32_u32(vmovl_u16(vget_low_u16(high))), scale);
        out[4 * h + 3] = vfmaq_f32(bias, vcvtq_f32_u32(vmovl_u16(vget_high_u16(high))), scale);
    }
}

static inline void vf_decode_int8(const uint8_t *packed, vf out[32 / VW])
{
    for (int h = 0; h < 2; h++) {
        int8x16_t bytes = vld1q_s8((const int8_t *)packed + 16 * h);
        int16x8_t low = vmovl_s8(vget_low_s8(bytes));
        int16x8_t high = vmovl_s8(vget_high_s8(bytes));
        out[4 * h + 0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(low)));
        out[4 * h + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(low)));
        out[4 * h + 2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(high)));
        out[4 * h + 3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(high)));
    }
}

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
