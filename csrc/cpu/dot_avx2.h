/* Integer dot products for the dot layout on AVX2, for dot_body.h: 8 weight rows per vector,
 * one int32 lane each.
 *
 * Invariant: every primitive returns exact integer sums. vpmaddubsw saturates a pair sum above
 * 32767, so q4 codes (at most 15) meet int8 activations (|x| <= 127) directly and their int16
 * lanes are summed over the block (at most 8 * 3810) before widening, while q8_0 weights are
 * made signed and multiplied as |w| times x with w's sign (a pair is at most 2 * 128 * 127).
 */
#include "kernels.h"
#include "x86_intrinsics.h"
#include <string.h>

#define DOT_TILE_ROWS 8
#define DOT_Q8_CODE_BIAS 0
#define DOT_VW 8

typedef __m256i vi;
typedef __m256 dv; /* one weight row per lane */

/* One block's weight codes for 8 rows: code[j] pairs with activations 4j..4j+3; q4 codes are
 * 0..15, q8_0 codes are the signed weights. q4 and q8_0 codes are not decoded up front: their
 * row functions read them from `chunks` as they go, so that eight rows' sums fit in the
 * registers. */
struct dot_codes {
    __m256i code[8];
    const uint8_t *chunks;
};

static inline vi vi_set1(int32_t a) { return _mm256_set1_epi32(a); }
static inline dv vi_to_dv(vi a) { return _mm256_cvtepi32_ps(a); }
static inline dv dv_zero(void) { return _mm256_setzero_ps(); }
static inline dv dv_set1(float a) { return _mm256_set1_ps(a); }
static inline dv dv_add(dv a, dv b) { return _mm256_add_ps(a, b); }
static inline dv dv_mul(dv a, dv b) { return _mm256_mul_ps(a, b); }
static inline void dv_store(float *p, dv v) { _mm256_storeu_ps(p, v); }
static inline dv dv_load(const float *p) { return _mm256_loadu_ps(p); }

static inline dv dv_load_half(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline void dot_load_q4(const uint8_t *chunks, struct dot_codes *w) { w->chunks = chunks; }

/* Unsigned byte codes (at most 63) as stored. */
static inline void dot_load_u8(const uint8_t *chunks, struct dot_codes *w)
{
    for (int j = 0; j < 8; j++)
        w->code[j] = _mm256_loadu_si256((const __m256i *)(chunks + j * DOT_CHUNK));
}

/* 5- and 6-bit codes (dot_layout.h): the nibble chunks' low 4 bits, or'ed with bit 4 (q5) or
 * bits 4..5 (q6_k) of each code, moved within its byte from the high chunk(s) (the mask drops
 * what a shift brings from a neighbouring byte). */
#define DOT_LOAD_HIGH 1
static inline __m256i or_masked(__m256i a, __m256i b, __m256i mask)
{
    return _mm256_or_si256(a, _mm256_and_si256(b, mask));
}

static inline void dot_load_high(const int format, const uint8_t *chunks, struct dot_codes *w)
{
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    for (int t = 0; t < 4; t++) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(chunks + t * DOT_CHUNK));
        w->code[t] = _mm256_and_si256(bytes, nibble);
        w->code[t + 4] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    }
    const uint8_t *high = chunks + 4 * DOT_CHUNK;
    if (format == FORMAT_Q6_K) {
        const __m256i mask = _mm256_set1_epi8(0x30);
        for (int p = 0; p < 2; p++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(high + p * DOT_CHUNK));
            __m256i *code = w->code + 4 * p;
            code[0] = or_masked(code[0], _mm256_slli_epi16(bits, 4), mask);
            code[1] = or_masked(code[1], _mm256_slli_epi16(bits, 2), mask);
            code[2] = or_masked(code[2], bits, mask);
            code[3] = or_masked(code[3], _mm256_srli_epi16(bits, 2), mask);
        }
        return;
    }
    const __m256i mask = _mm256_set1_epi8(0x10);
    const __m256i bits = _mm256_loadu_si256((const __m256i *)high);
    w->code[0] = or_masked(w->code[0], _mm256_slli_epi16(bits, 4), mask);
    w->code[1] = or_masked(w->code[1], _mm256_slli_epi16(bits, 3), mask);
    w->code[2] = or_masked(w->code[2], _mm256_slli_epi16(bits, 2), mask);
    w->code[3] = or_masked(w->code[3], _mm256_slli_epi16(bits, 1), mask);
    w->code[4] = or_masked(w->code[4], bits, mask);
    w->code[5] = or_masked(w->code[5], _mm256_srli_epi16(bits, 1), mask);
    w->code[6] = or_masked(w->code[6], _mm256_srli_epi16(bits, 2), mask);
    w->code[7] = or_masked(w->code[7], _mm256_srli_epi16(bits, 3), mask);
}

/* 2-bit codes (dot_record.h's crumbs): chunk t (0, 1) holds per row 4 bytes whose bits
 * 2s..2s+1 are the codes paired with activations 8s+4t..; they become byte codes 0..3. */
static inline void dot_load_crumbs(const uint8_t *chunks, struct dot_codes *w)
{
    const __m256i mask = _mm256_set1_epi8(3);
    for (int t = 0; t < 2; t++) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(chunks + t * DOT_CHUNK));
        w->code[t] = _mm256_and_si256(bytes, mask);
        w->code[t + 2] = _mm256_and_si256(_mm256_srli_epi16(bytes, 2), mask);
        w->code[t + 4] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
        w->code[t + 6] = _mm256_and_si256(_mm256_srli_epi16(bytes, 6), mask);
    }
}

/* tq1_0: chunk j's byte codes from a chunk of bytes of five trits (dot_record.h's
 * dot_load_trits): ((v * power mod 256) * 3) >> 8 of each byte v, even and odd bytes apart in
 * 16-bit lanes. */
static inline void dot_trit_chunk(const uint8_t *chunk, int power, int j, struct dot_codes *w)
{
    const __m256i bytes = _mm256_loadu_si256((const __m256i *)chunk);
    const __m256i low_byte = _mm256_set1_epi16(0xff), multiplier = _mm256_set1_epi16((short)power);
    const __m256i three = _mm256_set1_epi16(3);
    __m256i even = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(bytes, low_byte),
                                                       multiplier), low_byte);
    __m256i odd = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(bytes, 8), multiplier),
                                   low_byte);
    even = _mm256_srli_epi16(_mm256_mullo_epi16(even, three), 8);
    odd = _mm256_srli_epi16(_mm256_mullo_epi16(odd, three), 8);
    w->code[j] = _mm256_or_si256(even, _mm256_slli_epi16(odd, 8));
}

/* q1_0's bits: bit s of a row's byte i pairs with activation 4s + i; it becomes the byte code
 * 2 * bit (moved to bit 1 of its own byte: the mask drops what a shift brings from the next). */
static inline void dot_load_signs(const uint8_t *chunks, struct dot_codes *w)
{
    const __m256i bytes = _mm256_loadu_si256((const __m256i *)chunks), two = _mm256_set1_epi8(2);
    w->code[0] = _mm256_and_si256(_mm256_slli_epi16(bytes, 1), two);
    w->code[1] = _mm256_and_si256(bytes, two);
    w->code[2] = _mm256_and_si256(_mm256_srli_epi16(bytes, 1), two);
    w->code[3] = _mm256_and_si256(_mm256_srli_epi16(bytes, 2), two);
    w->code[4] = _mm256_and_si256(_mm256_srli_epi16(bytes, 3), two);
    w->code[5] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), two);
    w->code[6] = _mm256_and_si256(_mm256_srli_epi16(bytes, 5), two);
    w->code[7] = _mm256_and_si256(_mm256_srli_epi16(bytes, 6), two);
}

/* q2_k and q3_k's codes (dot_k_low.h's layout) as byte codes, straight from the record: code
 * j = 4p + t is bits 2t..2t+1 of 2-bit chunk p's bytes, plus, for q3_k, bit j of the high-bit
 * chunk's moved to bit 2 (a 16-bit shift brings a neighbour's bits into a byte: the masks drop
 * them). */
#define DOT_K_LOW_PRIMITIVES
static ALWAYS_INLINE void dot_load_k_low(const int format, const uint8_t *chunks,
                                         struct dot_codes *w)
{
    const __m256i low_bits = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
    const __m256i high = format == FORMAT_Q3_K
                             ? _mm256_loadu_si256((const __m256i *)(chunks + 2 * DOT_CHUNK))
                             : _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(chunks + p * DOT_CHUNK));
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            const int j = 4 * p + t;
            __m256i code = _mm256_and_si256(_mm256_srli_epi16(bytes, 2 * t), low_bits);
            if (format == FORMAT_Q3_K) {
                const __m256i moved = j < 2 ? _mm256_slli_epi16(high, 2 - j)
                                            : _mm256_srli_epi16(high, j - 2);
                code = _mm256_or_si256(code, _mm256_and_si256(moved, bit2));
            }
            w->code[j] = code;
        }
    }
}

/* From this many rows on, q2_k's codes are scaled by their sub-scales once per block
 * (dot_k_low.h's k_low_sums): each code (0..3) times its row's scale of its half (0..15), in
 * the code's own byte of a 16-bit product (at most 45: nothing carries into the next byte, and
 * u8_chunks' int16 pairs stay below 32768). */
#define K_LOW_SCALED_ROWS 4
static inline void dot_scale_halves(struct dot_codes *w, vi scale0, vi scale1)
{
    const __m256i low = _mm256_or_si256(scale0, _mm256_slli_epi32(scale0, 16));
    const __m256i high = _mm256_or_si256(scale1, _mm256_slli_epi32(scale1, 16));
    for (int j = 0; j < 4; j++) {
        w->code[j] = _mm256_mullo_epi16(w->code[j], low);
        w->code[j + 4] = _mm256_mullo_epi16(w->code[j + 4], high);
    }
}

/* Row lanes' byte parameters as int32 lanes: the low (shift 0) or high (4) nibble, or the
 * signed byte. */
static inline vi vi_lanes_nibble(const uint8_t *p, int shift)
{
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    return shift ? _mm256_srli_epi32(bytes, 4) : _mm256_and_si256(bytes, _mm256_set1_epi32(15));
}
static inline vi vi_lanes_int8(const uint8_t *p)
{
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* q8_0 codes are read (and made signed) by dot_q8_rows as it goes. */
static inline void dot_load_q8(const uint8_t *chunks, struct dot_codes *w) { w->chunks = chunks; }

/* starts[i] + sum (kernels.h's start_at: where starts is NULL, the add folds away). */
static ALWAYS_INLINE __m256i start_plus(const int32_t *starts, int i, __m256i sum)
{
    return _mm256_add_epi32(_mm256_set1_epi32(start_at(starts, i)), sum);
}

static inline __m256i broadcast_four(const int8_t *x)
{
    int32_t four;
    memcpy(&four, x, sizeof four);
    return _mm256_set1_epi32(four);
}

/* isum[r] = starts[2 r] + sum of q * x_r for q4 codes q in 0..15, row r's activations at
 * x + 32 r. Chunk t holds the codes of activations 4t..4t+3 (low nibbles) and 4(t+4)..
 * (high nibbles); each is decoded once for all rows, and each row's sum is finished before
 * the next row's starts, so that only one row's partial sums are live at a time (summing all
 * rows chunk by chunk spills them to the stack). */
static ALWAYS_INLINE void dot_q4_rows(const struct dot_codes *w, const int8_t *x,
                                      const int32_t *starts, const int rows, vi *isum)
{
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    __m256i low[4], high[4];
    for (int t = 0; t < 4; t++) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(w->chunks + t * DOT_CHUNK));
        low[t] = _mm256_and_si256(bytes, nibble);
        high[t] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    }
    for (int r = 0; r < rows; r++) {
        const int8_t *xr = x + 32 * r;
        __m256i pairs = _mm256_setzero_si256();
        for (int t = 0; t < 4; t++)
            pairs = _mm256_add_epi16(
                pairs, _mm256_add_epi16(_mm256_maddubs_epi16(low[t], broadcast_four(xr + 4 * t)),
                                        _mm256_maddubs_epi16(high[t],
                                                             broadcast_four(xr + 4 * (t + 4)))));
        isum[r] = start_plus(starts, 2 * r, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
    }
}

/* The sum over chunks [from, to) of code * x for unsigned byte codes of at most 63: a pair of
 * products is at most 2 * 63 * 127 and two pairs 32004, so two chunks add in int16 before
 * they widen. */
static ALWAYS_INLINE __m256i u8_chunks(const struct dot_codes *w, const int8_t *x, int from,
                                       int to)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i total = _mm256_setzero_si256();
    for (int j = from; j < to; j += 2) {
        __m256i pairs = _mm256_add_epi16(
            _mm256_maddubs_epi16(w->code[j], broadcast_four(x + 4 * j)),
            _mm256_maddubs_epi16(w->code[j + 1], broadcast_four(x + 4 * j + 4)));
        total = _mm256_add_epi32(total, _mm256_madd_epi16(pairs, ones));
    }
    return total;
}

/* isum[r] = starts[2 r] + sum of q * x_r for unsigned byte codes q of at most 63. */
static ALWAYS_INLINE void dot_u8_rows(const struct dot_codes *w, const int8_t *x,
                                      const int32_t *starts, const int rows, vi *isum)
{
    for (int r = 0; r < rows; r++)
        isum[r] = start_plus(starts, 2 * r, u8_chunks(w, x + 32 * r, 0, 8));
}

/* As dot_u8_rows, over activations 0..15 (isum0, from starts[2 r]) and 16..31 (isum1, from
 * starts[2 r + 1]). */
static ALWAYS_INLINE void dot_u8_halves(const struct dot_codes *w, const int8_t *x,
                                        const int32_t *starts, const int rows, vi *isum0,
                                        vi *isum1)
{
    for (int r = 0; r < rows; r++) {
        isum0[r] = start_plus(starts, 2 * r, u8_chunks(w, x + 32 * r, 0, 4));
        isum1[r] = start_plus(starts, 2 * r + 1, u8_chunks(w, x + 32 * r, 4, 8));
    }
}

/* Lanewise int32 steps for the q2_k and q3_k sub-scales (dot_k_low.h); all exact. */
static inline vi vi_lanes_load(const int32_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vi vi_lanes_mul(vi a, vi b) { return _mm256_mullo_epi32(a, b); }
static inline vi vi_lanes_add(vi a, vi b) { return _mm256_add_epi32(a, b); }

/* isum[r] = starts[2 r] + sum of w * x_r for q8_0 weights w. */
static ALWAYS_INLINE void dot_q8_rows(const struct dot_codes *w, const int8_t *x,
                                      const int32_t *starts, const int rows, vi *isum)
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < rows; r++) isum[r] = start_plus(starts, 2 * r, _mm256_setzero_si256());
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int j = 0; j < 8; j++) {
        const __m256i code = _mm256_xor_si256(
            _mm256_loadu_si256((const __m256i *)(w->chunks + j * DOT_CHUNK)), bias);
        const __m256i magnitude = _mm256_abs_epi8(code);
        for (int r = 0; r < rows; r++) {
            __m256i signed_x = _mm256_sign_epi8(broadcast_four(x + 32 * r + 4 * j), code);
            __m256i pairs = _mm256_maddubs_epi16(magnitude, signed_x);
            isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pairs, ones));
        }
    }
}

#include "dot_lookup_avx2.h"
