/* Integer dot products for the dot layout on AVX-512 VNNI, for dot_body.h: 16 weight rows per
 * vector, one int32 lane each.
 *
 * Invariant: every primitive returns exact integer sums (vpdpbusd adds four u8 x s8 products
 * into an int32 lane without saturation, and no sum here can overflow), so the result does not
 * depend on how the products are grouped.
 */
#include "kernels.h"
#include "x86_intrinsics.h"
#include <string.h>

#define DOT_TILE_ROWS 8
/* q1_0 by table lookup where the CPU has VBMI (dot_sign_lookup.h). */
#define DOT_SIGN_LOOKUP 1
#define DOT_Q8_CODE_BIAS 128
#define DOT_VW 16

typedef __m512i vi;
typedef __m512 dv; /* one weight row per lane */

/* One block's weight codes for the 16 rows: code[j] pairs with activations 4j..4j+3. */
struct dot_codes {
    __m512i code[8];
};

static inline vi vi_set1(int32_t a) { return _mm512_set1_epi32(a); }
static inline dv vi_to_dv(vi a) { return _mm512_cvtepi32_ps(a); }
static inline dv dv_zero(void) { return _mm512_setzero_ps(); }
static inline dv dv_set1(float a) { return _mm512_set1_ps(a); }
static inline dv dv_add(dv a, dv b) { return _mm512_add_ps(a, b); }
static inline dv dv_mul(dv a, dv b) { return _mm512_mul_ps(a, b); }
static inline void dv_store(float *p, dv v) { _mm512_storeu_ps(p, v); }
static inline dv dv_load(const float *p) { return _mm512_loadu_ps(p); }

static inline dv dv_load_half(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline void dot_load_q4(const uint8_t *chunks, struct dot_codes *w)
{
    const __m512i nibble = _mm512_set1_epi32(0x0f0f0f0f);
    for (int t = 0; t < 4; t++) {
        __m512i bytes = _mm512_loadu_si512((const void *)(chunks + t * DOT_CHUNK));
        w->code[t] = _mm512_and_si512(bytes, nibble);
        w->code[t + 4] = _mm512_and_si512(_mm512_srli_epi32(bytes, 4), nibble);
    }
}

/* 5- and 6-bit codes (dot_layout.h): the nibble chunks' low 4 bits, or'ed with bit 4 (q5) or
 * bits 4..5 (q6_k) of each code, moved within its byte from the high chunk(s) (the mask drops
 * what a shift brings from a neighbouring byte); one shift and one ternary logic per chunk. */
#define DOT_LOAD_HIGH 1
static inline void dot_load_high(const int format, const uint8_t *chunks, struct dot_codes *w)
{
    dot_load_q4(chunks, w);
    const uint8_t *high = chunks + 4 * DOT_CHUNK;
    /* 0xF8: a | (b & c) */
    if (format == FORMAT_Q6_K) {
        const __m512i mask = _mm512_set1_epi32(0x30303030);
        for (int p = 0; p < 2; p++) {
            const __m512i bits = _mm512_loadu_si512((const void *)(high + p * DOT_CHUNK));
            __m512i *code = w->code + 4 * p;
            code[0] = _mm512_ternarylogic_epi32(code[0], _mm512_slli_epi32(bits, 4), mask, 0xF8);
            code[1] = _mm512_ternarylogic_epi32(code[1], _mm512_slli_epi32(bits, 2), mask, 0xF8);
            code[2] = _mm512_ternarylogic_epi32(code[2], bits, mask, 0xF8);
            code[3] = _mm512_ternarylogic_epi32(code[3], _mm512_srli_epi32(bits, 2), mask, 0xF8);
        }
        return;
    }
    const __m512i mask = _mm512_set1_epi32(0x10101010);
    const __m512i bits = _mm512_loadu_si512((const void *)high);
    w->code[0] = _mm512_ternarylogic_epi32(w->code[0], _mm512_slli_epi32(bits, 4), mask, 0xF8);
    w->code[1] = _mm512_ternarylogic_epi32(w->code[1], _mm512_slli_epi32(bits, 3), mask, 0xF8);
    w->code[2] = _mm512_ternarylogic_epi32(w->code[2], _mm512_slli_epi32(bits, 2), mask, 0xF8);
    w->code[3] = _mm512_ternarylogic_epi32(w->code[3], _mm512_slli_epi32(bits, 1), mask, 0xF8);
    w->code[4] = _mm512_ternarylogic_epi32(w->code[4], bits, mask, 0xF8);
    w->code[5] = _mm512_ternarylogic_epi32(w->code[5], _mm512_srli_epi32(bits, 1), mask, 0xF8);
    w->code[6] = _mm512_ternarylogic_epi32(w->code[6], _mm512_srli_epi32(bits, 2), mask, 0xF8);
    w->code[7] = _mm512_ternarylogic_epi32(w->code[7], _mm512_srli_epi32(bits, 3), mask, 0xF8);
}

/* 2-bit codes (dot_record.h's crumbs): chunk t (0, 1) holds per row 4 bytes whose bits
 * 2s..2s+1 are the codes paired with activations 8s+4t..; they become byte codes 0..3. */
static inline void dot_load_crumbs(const uint8_t *chunks, struct dot_codes *w)
{
    const __m512i mask = _mm512_set1_epi32(0x03030303);
    for (int t = 0; t < 2; t++) {
        const __m512i bytes = _mm512_loadu_si512((const void *)(chunks + t * DOT_CHUNK));
        w->code[t] = _mm512_and_si512(bytes, mask);
        w->code[t + 2] = _mm512_and_si512(_mm512_srli_epi32(bytes, 2), mask);
        w->code[t + 4] = _mm512_and_si512(_mm512_srli_epi32(bytes, 4), mask);
        w->code[t + 6] = _mm512_and_si512(_mm512_srli_epi32(bytes, 6), mask);
    }
}

/* tq1_0: chunk j's byte codes from a chunk of bytes of five trits (dot_record.h's
 * dot_load_trits): (q * 3) >> 8 of q = v * power mod 256 for each byte v, that is
 * [q >= 86] + [q >= 171]. A 16-bit product keeps the low byte's q exact, and the high
 * byte's once the low byte is cleared first. */
static inline void dot_trit_chunk(const uint8_t *chunk, int power, int j, struct dot_codes *w)
{
    __m512i q = _mm512_loadu_si512((const void *)chunk);
    if (power != 1) {
        const __m512i multiplier = _mm512_set1_epi16((short)power);
        const __m512i low = _mm512_mullo_epi16(q, multiplier);
        const __m512i high = _mm512_mullo_epi16(
            _mm512_and_si512(q, _mm512_set1_epi16((short)0xff00)), multiplier);
        q = _mm512_mask_blend_epi8(0xaaaaaaaaaaaaaaaaull, low, high);
    }
    const __m512i one = _mm512_maskz_mov_epi8(_mm512_cmpge_epu8_mask(q, _mm512_set1_epi8(86)),
                                              _mm512_set1_epi8(1));
    w->code[j] = _mm512_mask_blend_epi8(_mm512_cmpge_epu8_mask(q, _mm512_set1_epi8((char)171)),
                                        one, _mm512_set1_epi8(2));
}

/* q1_0's bits: bit s of a row's byte i pairs with activation 4s + i; it becomes the byte code
 * 2 * bit (moved to bit 1 of its own byte: the mask drops what a shift brings from the next). */
static inline void dot_load_signs(const uint8_t *chunks, struct dot_codes *w)
{
    const __m512i bytes = _mm512_loadu_si512((const void *)chunks);
    const __m512i two = _mm512_set1_epi32(0x02020202);
    w->code[0] = _mm512_and_si512(_mm512_slli_epi32(bytes, 1), two);
    w->code[1] = _mm512_and_si512(bytes, two);
    w->code[2] = _mm512_and_si512(_mm512_srli_epi32(bytes, 1), two);
    w->code[3] = _mm512_and_si512(_mm512_srli_epi32(bytes, 2), two);
    w->code[4] = _mm512_and_si512(_mm512_srli_epi32(bytes, 3), two);
    w->code[5] = _mm512_and_si512(_mm512_srli_epi32(bytes, 4), two);
    w->code[6] = _mm512_and_si512(_mm512_srli_epi32(bytes, 5), two);
    w->code[7] = _mm512_and_si512(_mm512_srli_epi32(bytes, 6), two);
}

/* q2_k and q3_k's codes (dot_k_low.h's layout) as byte codes, straight from the record: code
 * j = 4p + t is bits 2t..2t+1 of 2-bit chunk p's bytes, plus, for q3_k, bit j of the high-bit
 * chunk's moved to bit 2 (a 32-bit shift brings a neighbour's bits into a byte: the masks drop
 * them). */
#define DOT_K_LOW_PRIMITIVES
static ALWAYS_INLINE void dot_load_k_low(const int format, const uint8_t *chunks,
                                         struct dot_codes *w)
{
    const __m512i low_bits = _mm512_set1_epi32(0x03030303), bit2 = _mm512_set1_epi32(0x04040404);
    const __m512i high = format == FORMAT_Q3_K
                             ? _mm512_loadu_si512((const void *)(chunks + 2 * DOT_CHUNK))
                             : _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int p = 0; p < 2; p++) {
        const __m512i bytes = _mm512_loadu_si512((const void *)(chunks + p * DOT_CHUNK));
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) {
            const int j = 4 * p + t;
            const __m512i low = _mm512_srli_epi32(bytes, 2 * t);
            if (format != FORMAT_Q3_K) {
                w->code[j] = _mm512_and_si512(low, low_bits);
                continue;
            }
            const __m512i moved = j < 2 ? _mm512_slli_epi32(high, 2 - j)
                                        : _mm512_srli_epi32(high, j - 2);
            /* (low & 3) | (moved & 4): 0xEA is a & b | c with a = low, b = 3, c = moved & 4. */
            w->code[j] = _mm512_ternarylogic_epi32(low, low_bits, _mm512_and_si512(moved, bit2),
                                                   0xEA);
        }
    }
}

/* From this many rows on, q2_k's codes are scaled by their sub-scales once per block
 * (dot_k_low.h's k_low_sums): each code (0..3) times its row's scale of its half (0..15), in
 * the code's own byte of a 16-bit product (at most 45: nothing carries into the next byte). */
#define K_LOW_SCALED_ROWS 4
static inline void dot_scale_halves(struct dot_codes *w, vi scale0, vi scale1)
{
    const __m512i low = _mm512_or_si512(scale0, _mm512_slli_epi32(scale0, 16));
    const __m512i high = _mm512_or_si512(scale1, _mm512_slli_epi32(scale1, 16));
    for (int j = 0; j < 4; j++) {
        w->code[j] = _mm512_mullo_epi16(w->code[j], low);
        w->code[j + 4] = _mm512_mullo_epi16(w->code[j + 4], high);
    }
}

/* Row lanes' byte parameters as int32 lanes: the low (shift 0) or high (4) nibble, or the
 * signed byte. */
static inline vi vi_lanes_nibble(const uint8_t *p, int shift)
{
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    return shift ? _mm512_srli_epi32(bytes, 4) : _mm512_and_si512(bytes, _mm512_set1_epi32(15));
}
/* Row lanes' nibble pairs as 16-bit pairs: low nibble | high nibble << 16 ((z | z << 12) &
 * 0x000F000F, 0xA8 being (a | b) & c), for vi_pairs_dot. */
#define DOT_MINIMUM_PAIRS
static inline vi vi_lanes_nibble_pairs(const uint8_t *p)
{
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_ternarylogic_epi32(bytes, _mm512_slli_epi32(bytes, 12),
                                     _mm512_set1_epi32(0x000F000F), 0xA8);
}
/* Each lane's two 16-bit halves times the two 16-bit halves of `pair`, summed: exact int32
 * (vpdpwssd onto zero: the emulated build's SIMDe lacks a usable 512-bit vpmaddwd). */
static inline vi vi_pairs_dot(vi pairs, int32_t pair)
{
    return _mm512_dpwssd_epi32(_mm512_setzero_si512(), pairs, _mm512_set1_epi32(pair));
}
static inline vi vi_lanes_int8(const uint8_t *p)
{
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* q8_0 codes stay biased (w + 128, unsigned): dot_q8 takes the bias back out exactly. */
static inline void dot_load_q8(const uint8_t *chunks, struct dot_codes *w)
{
    for (int j = 0; j < 8; j++)
        w->code[j] = _mm512_loadu_si512((const void *)(chunks + j * DOT_CHUNK));
}

static inline __m512i broadcast_four(const int8_t *x)
{
    int32_t four;
    memcpy(&four, x, sizeof four);
    return _mm512_set1_epi32(four);
}

/* acc + code times the four activations at x in every lane, the activations read as a
 * broadcast memory operand: gcc does not fold _mm512_set1_epi32 of a load into vpdpbusd, and
 * a separate broadcast costs a vector operation per product on CPUs where this is bound by
 * them (the decode-shaped matvec of the low-bit codes). */
static ALWAYS_INLINE __m512i dpbusd_four(__m512i acc, __m512i code, const int8_t *x)
{
#if defined(EXACTDRAFT_EMULATE_X86)
    return _mm512_dpbusd_epi32(acc, code, broadcast_four(x));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(code), "m"(*(const int32_t *)x));
    return acc;
#endif
}
/* The same for a tile of `rows`: with many rows the compiler's own scheduling of the
 * intrinsic (with its separate broadcasts) is the faster. */
static ALWAYS_INLINE __m512i dpbusd_rows(__m512i acc, __m512i code, const int8_t *x,
                                         const int rows)
{
    if (rows <= 4) return dpbusd_four(acc, code, x);
    return _mm512_dpbusd_epi32(acc, code, broadcast_four(x));
}

/* isum[r] = starts[2 r] + the sum over the block of code * x_r for rows r < `rows`, row r's
 * activations at x + 32 r. Rows are interleaved so that independent vpdpbusd chains overlap;
 * up to 4 rows each also run two chains, added at the end. */
static ALWAYS_INLINE void dot_rows(const struct dot_codes *w, const int8_t *x,
                                   const int32_t *starts, const int rows, vi *isum)
{
    __m512i other[DOT_TILE_ROWS];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        isum[r] = _mm512_set1_epi32(start_at(starts, 2 * r));
        other[r] = _mm512_setzero_si512();
    }
    const int split = rows <= 4;
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            const int8_t *four = x + QUANT_BLOCK * r + 4 * j;
            if (split && (j & 1)) other[r] = dpbusd_rows(other[r], w->code[j], four, rows);
            else isum[r] = dpbusd_rows(isum[r], w->code[j], four, rows);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
        if (split) isum[r] = _mm512_add_epi32(isum[r], other[r]);
}

/* tq2_0's sums (dot_low_bit.h) for up to 4 rows: the crumbs of activations 16..31 (bits 4..5
 * of their bytes) are decoded without their shift, as 16 times their value, so one shift
 * serves two chunks; their sums, multiples of 16, are summed apart and divided exactly. More
 * rows take the plain decode, whose cost is shared by the rows. */
#define DOT_CRUMB_ROWS
static ALWAYS_INLINE void dot_crumb_rows(const uint8_t *chunks, const int8_t *x,
                                         const int32_t *starts, const int rows, vi *isum)
{
    struct dot_codes w;
    if (rows > 4) {
        dot_load_crumbs(chunks, &w);
        dot_rows(&w, x, starts, rows, isum);
        return;
    }
    const __m512i low = _mm512_set1_epi32(0x03030303), high = _mm512_set1_epi32(0x30303030);
    for (int t = 0; t < 2; t++) {
        const __m512i bytes = _mm512_loadu_si512((const void *)(chunks + t * DOT_CHUNK));
        const __m512i shifted = _mm512_srli_epi32(bytes, 2);
        w.code[t] = _mm512_and_si512(bytes, low);
        w.code[t + 2] = _mm512_and_si512(shifted, low);
        w.code[t + 4] = _mm512_and_si512(bytes, high);
        w.code[t + 6] = _mm512_and_si512(shifted, high);
    }
    /* `second` sums 16 S with |S| <= 16 * 3 * 127 < 8192: started at 16 * 8192 it stays a
     * positive multiple of 16, which a logical shift divides exactly; `first` takes 8192 back
     * (no arithmetic shift: the emulated build's SIMDe lacks the 512-bit one). */
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) {
        const int8_t *row = x + QUANT_BLOCK * r;
        __m512i first = _mm512_set1_epi32(start_at(starts, 2 * r) - 8192);
        __m512i second = _mm512_set1_epi32(16 * 8192);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            first = dpbusd_four(first, w.code[j], row + 4 * j);
            second = dpbusd_four(second, w.code[j + 4], row + 16 + 4 * j);
        }
        isum[r] = _mm512_add_epi32(first, _mm512_srli_epi32(second, 4));
    }
}

/* isum0[r] = starts[2 r] + the sum over the block's activations 0..15 of code * x_r, isum1[r]
 * = starts[2 r + 1] + the sum over 16..31 (chunks 0..3 and 4..7). */
static ALWAYS_INLINE void dot_u8_halves(const struct dot_codes *w, const int8_t *x,
                                        const int32_t *starts, const int rows, vi *isum0,
                                        vi *isum1)
{
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        isum0[r] = _mm512_set1_epi32(start_at(starts, 2 * r));
        isum1[r] = _mm512_set1_epi32(start_at(starts, 2 * r + 1));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            const int8_t *row = x + QUANT_BLOCK * r;
            isum0[r] = dpbusd_rows(isum0[r], w->code[j], row + 4 * j, rows);
            isum1[r] = dpbusd_rows(isum1[r], w->code[j + 4], row + 16 + 4 * j, rows);
        }
    }
}

/* Lanewise int32 steps for the q2_k and q3_k sub-scales (dot_k_low.h); all exact. */
static inline vi vi_lanes_load(const int32_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline vi vi_lanes_mul(vi a, vi b) { return _mm512_mullo_epi32(a, b); }
static inline vi vi_lanes_add(vi a, vi b) { return _mm512_add_epi32(a, b); }

/* q4 codes are 0..15; byte codes are unsigned (q8_0's are w + 128: the starts hold
 * -128 sum(x)), and load as they are stored. */
#define dot_q4_rows dot_rows
#define dot_q8_rows dot_rows
#define dot_u8_rows dot_rows
#define dot_load_u8 dot_load_q8

#include "dot_lookup_avx512vnni.h"
