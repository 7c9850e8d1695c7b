/* What a dot-layout record (kernels.h) holds for a format, and the float steps that turn one
 * block's exact integer sums into an output's term: shared by the integer-dot matmul of every
 * level (dot_body.h) and the tile matmul (dot_tiles.h), after a level's dot_*.h primitives.
 *
 * Invariant: dot_block_term and dot_store_row are the only float steps of the integer-dot
 * matmul, one correctly rounded operation each in the order dot_body.h states, so every kernel
 * that feeds them the same exact integer sums writes the same bits.
 */

#include "dot_layout.h"

/* How many records ahead of the one in use the kernels prefetch. */
#define DOT_PREFETCH_RECORDS 16

/* Whether the codes carry an offset that the starts take out (set_dot_starts): else every
 * start is 0 and the row functions get starts = NULL. */
#define CODE_OFFSET(F) ((F) == FORMAT_Q4_0 || (F) == FORMAT_Q5_0 || (F) == FORMAT_Q6_K || \
                        (((F) == FORMAT_Q8_0 || LOOKUP_CODES(F)) && DOT_Q8_CODE_BIAS != 0) || \
                        CRUMB_CODES(F) || SIGN_CODES(F) || TRIT_CODES(F))

/* The lanes' block scale of a lookup format without a super-block header (lookup_values.h):
 * the float16 d of iq4_nl, mxfp4's 2^(e - 128). */
static ALWAYS_INLINE dv dot_lookup_scale(const int format, const uint8_t *record,
                                         ptrdiff_t lane0)
{
    if (format == FORMAT_MXFP4) return dv_load_e8m0_half(record + lane0);
    return dv_load_half((const uint16_t *)record + lane0);
}

/* The parameters of block b of a group whose records start at `records` (FORMAT_ROWS'
 * dot_record_bytes apart, per block of 32), and the codes of block b given them. */
static ALWAYS_INLINE const uint8_t *dot_record_parameters(const int format, const uint8_t *records,
                                                          ptrdiff_t b, size_t record_bytes)
{
    return records + (size_t)(b - b % SHARED_BLOCKS(format)) * record_bytes;
}

static ALWAYS_INLINE const uint8_t *dot_record_codes(const int format, const uint8_t *parameters,
                                                     ptrdiff_t b)
{
    return parameters + PARAMETER_BYTES(format) +
           (SHARED_BLOCKS(format) == 1 ? 0
                                       : (size_t)(b % SHARED_BLOCKS(format)) *
                                             SHARED_CODE_BYTES(format)) +
           SUB_SCALE_BYTES(format);
}

/* tq1_0's codes of block `sub` (0..7) of a GGUF block, as ggml orders its trits: blocks 0..4
 * are trit `sub` of bytes 0..31 (chunks 0..7); blocks 5 and 6 are trits 2 (sub - 5) and
 * 2 (sub - 5) + 1 of bytes 32..47 (chunks 8..11) for activations 0..15 and 16..31; block 7 is
 * trit 4 of bytes 32..47, then trits 0..3 of bytes 48..51 (chunk 12, one trit per chunk of 4
 * activations). The level's dot_trit_chunk decodes one chunk: trit n of byte v is
 * ((v * 3^n mod 256) * 3) >> 8. */
static ALWAYS_INLINE void dot_load_trits(const uint8_t *chunks, int sub, struct dot_codes *w)
{
    static const uint8_t powers_of_three[5] = {1, 3, 9, 27, 81};
    for (int j = 0; j < 8; j++) {
        const int chunk = sub < 5 ? j : sub < 7 ? 8 + j % 4 : j < 4 ? 8 + j : 12;
        const int trit = sub < 5 ? sub : sub < 7 ? 2 * (sub - 5) + j / 4 : j < 4 ? 4 : j - 4;
        dot_trit_chunk(chunks + chunk * DOT_CHUNK, powers_of_three[trit], j, w);
    }
}

/* The lanes' block parameter `which` (0: scale, 1: minimum or q6_k's second scale) from the
 * block's record (a shared record's header) and codes (dot_record_codes: a super-block
 * format's sub-scales sit just before them). d * sc and -dmin * m are exact: a float16 times
 * an integer of at most 8 bits has at most 19 significant bits. */
static ALWAYS_INLINE dv dot_parameter(const int format, const uint8_t *record,
                                      const uint8_t *codes, int which, ptrdiff_t lane0)
{
    if (SUPER_HEADER(format)) {
        const int8_t *sub_scales = (const int8_t *)codes - SUB_SCALE_BYTES(format);
        const int header = format == FORMAT_Q6_K ? 0 : which;
        return dv_mul(dv_load_half((const uint16_t *)record + header * DOT_GROUP + lane0),
                      dv_load_int8(sub_scales + which * DOT_GROUP + lane0));
    }
    if (LOOKUP_CODES(format)) return dot_lookup_scale(format, record, lane0);
    return dv_load_half((const uint16_t *)record + which * DOT_GROUP + lane0);
}

/* The 5- and 6-bit codes (dot_layout.h's HIGH_BIT_CODES, HIGH_CRUMB_CODES) of `lane_bytes` / 4
 * rows, from `codes` (the rows' first byte of chunk 0), as one byte each in the byte formats'
 * chunks at `out` (chunk j at out + j * DOT_CHUNK). A loop of byte operations the compiler
 * turns into the level's vectors. */
static ALWAYS_INLINE void dot_unpack_high(const int format, const uint8_t *codes, uint8_t *out,
                                          int lane_bytes)
{
    const uint8_t *high = codes + 4 * DOT_CHUNK;
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        for (int o = 0; o < lane_bytes; o++) {
            const uint8_t nibbles = codes[(j % 4) * DOT_CHUNK + o];
            const int low = j < 4 ? nibbles & 15 : nibbles >> 4;
            const int top = HIGH_CRUMB_CODES(format)
                                ? (high[(j / 4) * DOT_CHUNK + o] >> (2 * (j % 4))) & 3
                                : (high[o] >> j) & 1;
            out[j * DOT_CHUNK + o] = (uint8_t)(low | top << 4);
        }
}

/* One block's term of activation row `index` (the quantized rows' block-major index) from the
 * block's parameters and exact integer sums (isum1: q6_k's second half, q2_k's minimums' sum,
 * read by those only). */
static ALWAYS_INLINE dv dot_block_term(const int format, dv scale, dv second,
                                       const struct quantized_rows *q, ptrdiff_t index, vi isum,
                                       const vi *isum1)
{
    const dv activation_scale = dv_set1(q->scales[index]);
    dv term = dv_mul(dv_mul(scale, activation_scale), vi_to_dv(isum));
    if (HAS_MINIMUM(format))
        term = dv_add(term, dv_mul(second, dv_set1(q->scaled_sums[index])));
    else if (format == FORMAT_Q6_K || format == FORMAT_Q2_K)
        term = dv_add(term, dv_mul(dv_mul(second, activation_scale), vi_to_dv(*isum1)));
    return term;
}

/* The first `columns` lanes of an output row's accumulator, plus the bias where there is one. */
static ALWAYS_INLINE void dot_store_row(dv acc, const float *bias, float *out, int columns)
{
    float lanes[DOT_VW];
    dv_store(lanes, acc);
    for (int c = 0; c < columns; c++) {
        float total = lanes[c];
        if (bias) total += bias[c];
        out[c] = total;
    }
}
