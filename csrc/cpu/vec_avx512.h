/* 16-lane float vectors on AVX-512F, for kernel_body.h.
 *
 * Invariant: each primitive is one fixed sequence of IEEE operations; horizontal reductions use
 * a fixed pairing tree, so a reduction's bits depend only on the lane values.
 */
#include "x86_intrinsics.h"

#define VW 16
#define TILE_ROWS 4
/* Vector registers attention may fill with one head's accumulators, side by side. */
#define ATTENTION_REGISTERS 16
#define TILE_COLUMNS 4

typedef __m512 vf;

static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_set1(float a) { return _mm512_set1_ps(a); }
static inline vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vf_load_partial(const float *p, int n)
{
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
static inline void vf_store_partial(float *p, vf v, int n)
{
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v);
}
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }

static inline vf vf_abs(vf a) { return _mm512_abs_ps(a); }

/* Store the 16 lanes, integral values in [-127, 127], as int8. */
static inline void vf_store_int8(int8_t *p, vf v)
{
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
}

static inline float vf_sum(vf v)
{
    __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}

/* Lane k of the result is vf_sum(d[k]), bit for bit: the same lanes meet in the same pairing
 * tree (halves, then quarters, then pairs, then neighbours), sixteen sums at a time. */
static inline vf vf_sum_lanes(const vf d[VW])
{
    vf halves[8], quarters[4], pairs[2];
    for (int k = 0; k < 8; k++)
        halves[k] = _mm512_add_ps(_mm512_shuffle_f32x4(d[2 * k], d[2 * k + 1], 0x44),
                                  _mm512_shuffle_f32x4(d[2 * k], d[2 * k + 1], 0xee));
    for (int k = 0; k < 4; k++)
        quarters[k] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * k], halves[2 * k + 1], 0x88),
                                    _mm512_shuffle_f32x4(halves[2 * k], halves[2 * k + 1], 0xdd));
    for (int k = 0; k < 2; k++)
        pairs[k] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * k], quarters[2 * k + 1], 0x44),
                                 _mm512_shuffle_ps(quarters[2 * k], quarters[2 * k + 1], 0xee));
    vf sums = _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], 0x88),
                            _mm512_shuffle_ps(pairs[0], pairs[1], 0xdd));
    /* Lane 4 q + r now holds the sum of d[q + 4 r]. */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, sums);
}

static inline float vf_max_all(vf v)
{
    __m256 eight = _mm256_max_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 four = _mm_max_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps(two, two, 1)));
}

/* Lane-wise a > b ? t : f (false for NaN). */
static inline vf vf_select_greater(vf a, vf b, vf t, vf f)
{
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), f, t);
}

static inline vf vf_select_nan(vf a, vf t, vf f)
{
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), f, t);
}

/* 2^n for integral n in [-126, 127]. */
static inline vf vf_pow2n(vf n)
{
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n),
                                                      _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(bits);
}

/* Round to the nearest integer, ties to even. */
static inline vf vf_round(vf a)
{
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline vf vf_load_bf16(const uint16_t *p)
{
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* 32 GGUF q4 weights nibble * scale + bias (one rounding each) from 16 packed bytes: element i
 * is the low nibble of byte i, element i + 16 the high nibble. The 16 possible values are
 * computed once into a vector and looked up: vpermps reads only the low 4 bits of an index, so
 * the low nibble needs no mask. */
static inline void vf_decode_q4(const uint8_t *packed, vf scale, vf bias, vf out[32 / VW])
{
    const vf table = _mm512_fmadd_ps(
        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), scale, bias);
    __m512i index = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)packed));
    out[0] = _mm512_permutexvar_ps(index, table);
    out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(index, 4), table);
}

static inline void vf_decode_int8(const uint8_t *packed, vf out[32 / VW])
{
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)packed)));
    out[1] = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(packed + 16))));
}

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    __builtin_memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
