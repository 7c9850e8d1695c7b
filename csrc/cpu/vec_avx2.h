/* 8-lane float vectors on AVX2 with FMA and F16C, for kernel_body.h.
 *
 * Invariant: each primitive is one fixed sequence of IEEE operations; horizontal reductions use
 * a fixed pairing tree, so a reduction's bits depend only on the lane values.
 */
#include <immintrin.h>
#include <string.h>

#define VW 8
#define TILE_ROWS 4
/* Vector registers attention may fill with one head's accumulators, side by side. */
#define ATTENTION_REGISTERS 8
#define TILE_COLUMNS 2

typedef __m256 vf;

static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_set1(float a) { return _mm256_set1_ps(a); }
static inline vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }

static inline __m256i lane_mask(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vf vf_load_partial(const float *p, int n)
{
    return _mm256_maskload_ps(p, lane_mask(n));
}
static inline void vf_store_partial(float *p, vf v, int n)
{
    _mm256_maskstore_ps(p, lane_mask(n), v);
}
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }

static inline vf vf_abs(vf a)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a);
}

/* Store the 8 lanes, integral values in [-127, 127], as int8. */
static inline void vf_store_int8(int8_t *p, vf v)
{
    __m256i whole = _mm256_cvtps_epi32(v);
    __m128i halves = _mm_packs_epi32(_mm256_castsi256_si128(whole),
                                     _mm256_extracti128_si256(whole, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(halves, halves));
}

static inline float vf_sum(vf v)
{
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 1)));
}

/* Lane k of the result is vf_sum(d[k]), bit for bit: the same lanes meet in the same pairing
 * tree (halves, then pairs, then neighbours), eight sums at a time. */
static inline vf vf_sum_lanes(const vf d[VW])
{
    vf halves[4], pairs[2];
    for (int k = 0; k < 4; k++)
        halves[k] = _mm256_add_ps(_mm256_permute2f128_ps(d[2 * k], d[2 * k + 1], 0x20),
                                  _mm256_permute2f128_ps(d[2 * k], d[2 * k + 1], 0x31));
    for (int k = 0; k < 2; k++)
        pairs[k] = _mm256_add_ps(_mm256_shuffle_ps(halves[2 * k], halves[2 * k + 1], 0x44),
                                 _mm256_shuffle_ps(halves[2 * k], halves[2 * k + 1], 0xee));
    vf sums = _mm256_add_ps(_mm256_shuffle_ps(pairs[0], pairs[1], 0x88),
                            _mm256_shuffle_ps(pairs[0], pairs[1], 0xdd));
    /* Lane 4 h + r now holds the sum of d[h + 2 r]. */
    return _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline float vf_max_all(vf v)
{
    __m128 four = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_max_ss(two, _mm_shuffle_ps(two, two, 1)));
}

static inline vf vf_select_greater(vf a, vf b, vf t, vf f)
{
    return _mm256_blendv_ps(f, t, _mm256_cmp_ps(a, b, _CMP_GT_OQ));
}

static inline vf vf_select_nan(vf a, vf t, vf f)
{
    return _mm256_blendv_ps(f, t, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

static inline vf vf_pow2n(vf n)
{
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                      _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(bits);
}

static inline vf vf_round(vf a)
{
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline vf vf_load_bf16(const uint16_t *p)
{
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/* 32 GGUF q4 weights nibble * scale + bias (exact product, one rounding): element i is the
 * low nibble of byte i, element i + 16 the high nibble. */
static inline void vf_decode_q4(const uint8_t *packed, vf scale, vf bias, vf out[32 / VW])
{
    __m128i bytes = _mm_loadu_si128((const __m128i *)packed);
    __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0f));
    __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0f));
    __m128i parts[4] = {low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)};
    for (int i = 0; i < 4; i++)
        out[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i])), scale, bias);
}

static inline void vf_decode_int8(const uint8_t *packed, vf out[32 / VW])
{
    for (int i = 0; i < 4; i++) {
        __m128i eight = _mm_loadl_epi64((const __m128i *)(packed + 8 * i));
        out[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight));
    }
}

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
