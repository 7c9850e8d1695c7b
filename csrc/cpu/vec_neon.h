/* The canonical 16-lane float vectors on arm64 NEON (four 4-lane registers), for kernel_body.h.
 *
 * Invariant: every primitive performs, lane by lane, the IEEE operation the canonical
 * arithmetic names (vec_scalar.h states it): vfmaq is the fused multiply-add, max and min
 * follow a > b ? a : b (NEON's own vmaxq would propagate NaN and order zeros differently), and
 * the horizontal reductions meet the lanes in the canonical tree, so each result has the bits
 * the scalar level gives.
 */
#include <arm_neon.h>
#include <string.h>

#define VW 16
#define TILE_ROWS 2
#define TILE_COLUMNS 2
/* Vectors (of VW lanes) attention may fill with one head's accumulators, side by side. */
#define ATTENTION_REGISTERS 4

typedef struct {
    float32x4_t q[4]; /* lanes 0..3, 4..7, 8..11, 12..15 */
} vf;

#define LANES4(expr)                                    \
    do {                                                \
        for (int i = 0; i < 4; i++) r.q[i] = (expr);    \
    } while (0)

static inline vf vf_zero(void) { vf r; LANES4(vdupq_n_f32(0.0f)); return r; }
static inline vf vf_set1(float a) { vf r; LANES4(vdupq_n_f32(a)); return r; }
static inline vf vf_load(const float *p) { vf r; LANES4(vld1q_f32(p + 4 * i)); return r; }
static inline void vf_store(float *p, vf v)
{
    for (int i = 0; i < 4; i++) vst1q_f32(p + 4 * i, v.q[i]);
}
static inline vf vf_load_partial(const float *p, int n)
{
    float lanes[VW] = {0};
    memcpy(lanes, p, (size_t)n * sizeof(float));
    return vf_load(lanes);
}
static inline void vf_store_partial(float *p, vf v, int n)
{
    float lanes[VW];
    vf_store(lanes, v);
    memcpy(p, lanes, (size_t)n * sizeof(float));
}
static inline vf vf_add(vf a, vf b) { vf r; LANES4(vaddq_f32(a.q[i], b.q[i])); return r; }
static inline vf vf_sub(vf a, vf b) { vf r; LANES4(vsubq_f32(a.q[i], b.q[i])); return r; }
static inline vf vf_mul(vf a, vf b) { vf r; LANES4(vmulq_f32(a.q[i], b.q[i])); return r; }
static inline vf vf_div(vf a, vf b) { vf r; LANES4(vdivq_f32(a.q[i], b.q[i])); return r; }
static inline vf vf_fma(vf a, vf b, vf c)
{
    vf r;
    LANES4(vfmaq_f32(c.q[i], a.q[i], b.q[i]));
    return r;
}
static inline float32x4_t max4(float32x4_t a, float32x4_t b)
{
    return vbslq_f32(vcgtq_f32(a, b), a, b);
}
static inline vf vf_max(vf a, vf b) { vf r; LANES4(max4(a.q[i], b.q[i])); return r; }
static inline vf vf_min(vf a, vf b)
{
    vf r;
    LANES4(vbslq_f32(vcltq_f32(a.q[i], b.q[i]), a.q[i], b.q[i]));
    return r;
}

static inline vf vf_abs(vf a) { vf r; LANES4(vabsq_f32(a.q[i])); return r; }

/* Store the 16 lanes, integral values in [-127, 127], as int8. */
static inline void vf_store_int8(int8_t *p, vf v)
{
    int16x8_t low = vcombine_s16(vmovn_s32(vcvtq_s32_f32(v.q[0])), vmovn_s32(vcvtq_s32_f32(v.q[1])));
    int16x8_t high = vcombine_s16(vmovn_s32(vcvtq_s32_f32(v.q[2])),
                                  vmovn_s32(vcvtq_s32_f32(v.q[3])));
    vst1q_s8(p, vcombine_s8(vmovn_s16(low), vmovn_s16(high)));
}

/* Lanes i + i+8, then i + i+4, as one 4-lane register. */
static inline float32x4_t fold4(vf v)
{
    return vaddq_f32(vaddq_f32(v.q[0], v.q[2]), vaddq_f32(v.q[1], v.q[3]));
}

static inline float vf_sum(vf v)
{
    float32x4_t four = fold4(v);
    float32x2_t two = vadd_f32(vget_low_f32(four), vget_high_f32(four));
    return vget_lane_f32(two, 0) + vget_lane_f32(two, 1);
}

/* Lane k is the tree's i + i+2, then 0 + 1, of four[k], for four 4-lane registers. */
static inline float32x4_t sum4_lanes(const float32x4_t d[4])
{
    float32x4_t first = vaddq_f32(vcombine_f32(vget_low_f32(d[0]), vget_low_f32(d[1])),
                                  vcombine_f32(vget_high_f32(d[0]), vget_high_f32(d[1])));
    float32x4_t second = vaddq_f32(vcombine_f32(vget_low_f32(d[2]), vget_low_f32(d[3])),
                                   vcombine_f32(vget_high_f32(d[2]), vget_high_f32(d[3])));
    return vpaddq_f32(first, second);
}

/* Lane k of the result is vf_sum(d[k]), bit for bit. */
static inline vf vf_sum_lanes(const vf d[VW])
{
    vf r;
    for (int g = 0; g < 4; g++) {
        float32x4_t four[4];
        for (int k = 0; k < 4; k++) four[k] = fold4(d[4 * g + k]);
        r.q[g] = sum4_lanes(four);
    }
    return r;
}

/* The largest lane, met in the canonical tree with max(a, b) = a > b ? a : b. */
static inline float vf_max_all(vf v)
{
    float32x4_t four = max4(max4(v.q[0], v.q[2]), max4(v.q[1], v.q[3]));
    float lanes[4];
    vst1q_f32(lanes, four);
    float a = lanes[0] > lanes[2] ? lanes[0] : lanes[2];
    float b = lanes[1] > lanes[3] ? lanes[1] : lanes[3];
    return a > b ? a : b;
}

static inline vf vf_select_greater(vf a, vf b, vf t, vf f)
{
    vf r;
    LANES4(vbslq_f32(vcgtq_f32(a.q[i], b.q[i]), t.q[i], f.q[i]));
    return r;
}

static inline vf vf_select_nan(vf a, vf t, vf f)
{
    vf r;
    LANES4(vbslq_f32(vceqq_f32(a.q[i], a.q[i]), f.q[i], t.q[i]));
    return r;
}

static inline vf vf_pow2n(vf n)
{
    vf r;
    LANES4(vreinterpretq_f32_s32(
        vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23)));
    return r;
}

static inline vf vf_round(vf a) { vf r; LANES4(vrndnq_f32(a.q[i])); return r; }

static inline vf vf_load_bf16(const uint16_t *p)
{
    vf r;
    LANES4(vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * i), 16)));
    return r;
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
        uint32x4_t parts[4] = {vmovl_u16(vget_low_u16(low)), vmovl_u16(vget_high_u16(low)),
                               vmovl_u16(vget_low_u16(high)), vmovl_u16(vget_high_u16(high))};
        for (int i = 0; i < 4; i++)
            out[h].q[i] = vfmaq_f32(bias.q[0], vcvtq_f32_u32(parts[i]), scale.q[0]);
    }
}

static inline void vf_decode_int8(const uint8_t *packed, vf out[32 / VW])
{
    for (int h = 0; h < 2; h++) {
        int8x16_t bytes = vld1q_s8((const int8_t *)packed + 16 * h);
        int16x8_t low = vmovl_s8(vget_low_s8(bytes));
        int16x8_t high = vmovl_s8(vget_high_s8(bytes));
        out[h].q[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(low)));
        out[h].q[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(low)));
        out[h].q[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(high)));
        out[h].q[3] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(high)));
    }
}

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
