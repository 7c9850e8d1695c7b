/* The canonical 16-lane float vectors on AVX2 with FMA and F16C (two 8-lane registers), for
 * kernel_body.h.
 *
 * Invariant: every primitive performs, lane by lane, the IEEE operation the canonical
 * arithmetic names (vec_scalar.h states it), and the horizontal reductions meet the lanes in
 * the canonical tree (lane i + lane i+8, then i + i+4, then i + i+2, then 0 + 1), so each
 * result has the bits the scalar level gives.
 */
#include "x86_intrinsics.h"
#include <string.h>

#define VW 16
#define TILE_ROWS 1
#define TILE_COLUMNS 4
/* Vectors (of VW lanes) attention may fill with one head's accumulators, side by side. */
#define ATTENTION_REGISTERS 4
/* Keys of attention's VW-key loop unrolled: 4 ran 2-5% faster than 16 at 8 rows on Zen 3 (the same
 * bits; benchmarks/attention_ab.py). */
#define ATTENTION_KEY_UNROLL 4

typedef struct {
    __m256 lo, hi; /* lanes 0..7, 8..15 */
} vf;

#define LANES2(op) {op(a.lo, b.lo), op(a.hi, b.hi)}

static inline vf vf_zero(void) { return (vf){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline vf vf_set1(float a) { return (vf){_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
static inline vf vf_load(const float *p) { return (vf){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void vf_store(float *p, vf v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}

static inline __m256i lane_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_load_partial(const float *p, int n)
{
    return (vf){_mm256_maskload_ps(p, lane_mask(n)), _mm256_maskload_ps(p + 8, lane_mask(n - 8))};
}
static inline void vf_store_partial(float *p, vf v, int n)
{
    _mm256_maskstore_ps(p, lane_mask(n), v.lo);
    _mm256_maskstore_ps(p + 8, lane_mask(n - 8), v.hi);
}
static inline vf vf_add(vf a, vf b) { return (vf)LANES2(_mm256_add_ps); }
static inline vf vf_sub(vf a, vf b) { return (vf)LANES2(_mm256_sub_ps); }
static inline vf vf_mul(vf a, vf b) { return (vf)LANES2(_mm256_mul_ps); }
static inline vf vf_div(vf a, vf b) { return (vf)LANES2(_mm256_div_ps); }
static inline vf vf_max(vf a, vf b) { return (vf)LANES2(_mm256_max_ps); }
static inline vf vf_min(vf a, vf b) { return (vf)LANES2(_mm256_min_ps); }
static inline vf vf_fma(vf a, vf b, vf c)
{
    return (vf){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}

static inline vf vf_abs(vf a)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    return (vf){_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
}

/* Store the 16 lanes, integral values in [-127, 127], as int8. */
static inline void vf_store_int8(int8_t *p, vf v)
{
    __m256i low = _mm256_cvtps_epi32(v.lo), high = _mm256_cvtps_epi32(v.hi);
    __m128i a = _mm_packs_epi32(_mm256_castsi256_si128(low), _mm256_extracti128_si256(low, 1));
    __m128i b = _mm_packs_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1));
    _mm_storeu_si128((__m128i *)p, _mm_packs_epi16(a, b));
}

/* The canonical tree below lane i + lane i+8: i + i+4, i + i+2, 0 + 1. */
static inline float sum8(__m256 v)
{
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}

static inline float vf_sum(vf v) { return sum8(_mm256_add_ps(v.lo, v.hi)); }

/* Lane k of the result is sum8(d[k]) for eight 8-lane vectors, bit for bit: the same lanes
 * meet in the same tree, eight sums at a time. */
static inline __m256 sum8_lanes(const __m256 d[8])
{
    __m256 halves[4], pairs[2];
    for (int k = 0; k < 4; k++)
        halves[k] = _mm256_add_ps(_mm256_permute2f128_ps(d[2 * k], d[2 * k + 1], 0x20),
                                  _mm256_permute2f128_ps(d[2 * k], d[2 * k + 1], 0x31));
    for (int k = 0; k < 2; k++)
        pairs[k] = _mm256_add_ps(_mm256_shuffle_ps(halves[2 * k], halves[2 * k + 1], 0x44),
                                 _mm256_shuffle_ps(halves[2 * k], halves[2 * k + 1], 0xee));
    __m256 sums = _mm256_add_ps(_mm256_shuffle_ps(pairs[0], pairs[1], 0x88),
                                _mm256_shuffle_ps(pairs[0], pairs[1], 0xdd));
    /* Lane 4 h + r now holds the sum of d[h + 2 r]. */
    return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Lane k of the result is vf_sum(d[k]), bit for bit. */
static inline vf vf_sum_lanes(const vf d[VW])
{
    __m256 first[8], second[8];
    for (int k = 0; k < 8; k++) {
        first[k] = _mm256_add_ps(d[k].lo, d[k].hi);
        second[k] = _mm256_add_ps(d[k + 8].lo, d[k + 8].hi);
    }
    return (vf){sum8_lanes(first), sum8_lanes(second)};
}

/* The largest lane, met in the canonical tree with max(a, b) = a > b ? a : b. */
static inline float vf_max_all(vf v)
{
    __m256 eight = _mm256_max_ps(v.lo, v.hi);
    __m128 four = _mm_max_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps(two, two, 1)));
}

static inline vf vf_select_greater(vf a, vf b, vf t, vf f)
{
    return (vf){_mm256_blendv_ps(f.lo, t.lo, _mm256_cmp_ps(a.lo, b.lo, _CMP_GT_OQ)),
                _mm256_blendv_ps(f.hi, t.hi, _mm256_cmp_ps(a.hi, b.hi, _CMP_GT_OQ))};
}

static inline vf vf_select_nan(vf a, vf t, vf f)
{
    return (vf){_mm256_blendv_ps(f.lo, t.lo, _mm256_cmp_ps(a.lo, a.lo, _CMP_UNORD_Q)),
                _mm256_blendv_ps(f.hi, t.hi, _mm256_cmp_ps(a.hi, a.hi, _CMP_UNORD_Q))};
}

static inline __m256 pow2n8(__m256 n)
{
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                      _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(bits);
}
static inline vf vf_pow2n(vf n) { return (vf){pow2n8(n.lo), pow2n8(n.hi)}; }

static inline vf vf_round(vf a)
{
    const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return (vf){_mm256_round_ps(a.lo, mode), _mm256_round_ps(a.hi, mode)};
}

static inline __m256 bf16x8(const uint16_t *p)
{
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
static inline vf vf_load_bf16(const uint16_t *p) { return (vf){bf16x8(p), bf16x8(p + 8)}; }

/* 32 GGUF q4 weights nibble * scale + bias (exact product, one rounding): element i is the
 * low nibble of byte i, element i + 16 the high nibble. */
static inline void vf_decode_q4(const uint8_t *packed, vf scale, vf bias, vf out[32 / VW])
{
    __m128i bytes = _mm_loadu_si128((const __m128i *)packed);
    __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
    __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
    __m128i parts[4] = {low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)};
    __m256 values[4];
    for (int i = 0; i < 4; i++)
        values[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i])),
                                    scale.lo, bias.lo);
    out[0] = (vf){values[0], values[1]};
    out[1] = (vf){values[2], values[3]};
}

static inline void vf_decode_int8(const uint8_t *packed, vf out[32 / VW])
{
    __m256 values[4];
    for (int i = 0; i < 4; i++) {
        __m128i eight = _mm_loadl_epi64((const __m128i *)(packed + 8 * i));
        values[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
    }
    out[0] = (vf){values[0], values[1]};
    out[1] = (vf){values[2], values[3]};
}

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
