/* The lookup formats' primitives (lookup_values.h) for dot_avx2.h: one byte shuffle turns 32
 * nibble codes into their signed table values, which are multiplied as q8_0's weights are
 * (|w| times x with w's sign: a pair of products is at most 2 * 127 * 127, below vpmaddubsw's
 * saturation), so every sum is exact.
 */
#include "lookup_values.h"

/* code[j] (activations 4j..4j+3 of the 8 rows): the signed table values, DOT_Q8_CODE_BIAS 0. */
static inline void dot_load_lookup(const int8_t *table, const uint8_t *chunks,
                                   struct dot_codes *w)
{
    const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table));
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    for (int t = 0; t < 4; t++) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(chunks + t * DOT_CHUNK));
        w->code[t] = _mm256_shuffle_epi8(values, _mm256_and_si256(bytes, nibble));
        w->code[t + 4] = _mm256_shuffle_epi8(
            values, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble));
    }
}

/* 8 e8m0 bytes as their scales 2^(e - 128) (lookup_values.h's e8m0_half). */
static inline dv dv_load_e8m0_half(const uint8_t *p)
{
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small));
}

/* 8 int8 values as floats (exact). */
static inline dv dv_load_int8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* isum[r] = starts[2 r] + sum of w * x_r for the signed table values w. */
static ALWAYS_INLINE void dot_lookup_rows(const struct dot_codes *w, const int8_t *x,
                                          const int32_t *starts, const int rows, vi *isum)
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < rows; r++) isum[r] = start_plus(starts, 2 * r, _mm256_setzero_si256());
    for (int j = 0; j < 8; j++) {
        const __m256i magnitude = _mm256_abs_epi8(w->code[j]);
        for (int r = 0; r < rows; r++) {
            const __m256i signed_x = _mm256_sign_epi8(broadcast_four(x + 32 * r + 4 * j),
                                                      w->code[j]);
            isum[r] = _mm256_add_epi32(
                isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), ones));
        }
    }
}
