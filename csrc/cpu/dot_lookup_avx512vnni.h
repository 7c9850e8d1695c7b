/* The lookup formats' primitives (lookup_values.h) for dot_avx512vnni.h (and the tile levels,
 * which read the same codes as B tiles): one byte shuffle turns 64 nibble codes into their
 * table values plus 128 (DOT_Q8_CODE_BIAS), unsigned bytes that vpdpbusd multiplies exactly;
 * the starts take 128 * sum(x) back out.
 */
#include "lookup_values.h"

/* code[j] (activations 4j..4j+3 of the 16 rows): table value + 128, as unsigned bytes. */
static inline void dot_load_lookup(const int8_t *table, const uint8_t *chunks,
                                   struct dot_codes *w)
{
    const __m128i signed_values = _mm_loadu_si128((const __m128i *)table);
    const __m512i values = _mm512_broadcast_i32x4(
        _mm_xor_si128(signed_values, _mm_set1_epi8((char)0x80)));
    const __m512i nibble = _mm512_set1_epi8(0x0f);
    for (int t = 0; t < 4; t++) {
        const __m512i bytes = _mm512_loadu_si512((const void *)(chunks + t * DOT_CHUNK));
        w->code[t] = _mm512_shuffle_epi8(values, _mm512_and_si512(bytes, nibble));
        w->code[t + 4] = _mm512_shuffle_epi8(
            values, _mm512_and_si512(_mm512_srli_epi32(bytes, 4), nibble));
    }
}

#define dot_lookup_rows dot_rows

/* 16 e8m0 bytes as their scales 2^(e - 128) (lookup_values.h's e8m0_half). */
static inline dv dv_load_e8m0_half(const uint8_t *p)
{
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 small = _mm512_cmple_epu32_mask(e, _mm512_set1_epi32(1));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal));
}

/* 16 int8 values as floats (exact). */
static inline dv dv_load_int8(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
