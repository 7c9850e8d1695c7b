/* The dot layout of q2_k and q3_k, the K-quants with 2 and 3 bit codes, and the integer steps
 * that turn their codes into a block's exact sums; included by dot_body.h and dot_tiles.h after
 * dot_record.h and a level's dot_*.h primitives.
 *
 * Their records keep the codes at their stored width, and a group's float16 super-block
 * scales once per 256 weights: per group of DOT_GROUP rows and super-block of 8 blocks of 32,
 *   q2_k (1344 bytes): a header of 16 float16 d, then 16 float16 -dmin; then per block
 *     (160 bytes) 16 bytes sc0 | sc1 << 4 (the 4-bit scales of the block's weights 0..15 and
 *     16..31), 16 bytes m0 | m1 << 4 (their 4-bit minimums), then 2 chunks of 2-bit codes;
 *   q3_k (1824 bytes): a header of 16 float16 d; then per block (224 bytes) 16 int8 scales s0
 *     (sc - 32 of weights 0..15), 16 int8 s1 (of 16..31), 2 chunks of the codes' low 2 bits, 1
 *     chunk of their high bit;
 * where 2-bit chunk p holds, in byte 4 lane + i, bits 2t..2t+1 = the low bits of code
 * 4 (4p + t) + i, and the high-bit chunk, in byte 4 lane + i, bit j = bit 2 of code 4j + i.
 * Codes are unsigned (q2_k 0..3: w = d sc code - dmin m; q3_k 0..7: w = d s (code - 4)).
 *
 * Invariant: a block's sums are exact integers (|I| < 2^20): q2_k's I = sc0 isum0 + sc1 isum1
 * and M = m0 sum(x, 0..15) + m1 sum(x, 16..31), q3_k's I = s0 isum0 + s1 isum1 with the
 * halves' offset 4 taken out by the starts, formed exactly in int32 lanes by every level (a
 * level may scale q2_k's codes by their sub-scales first, or form M from 16-bit pairs: the
 * same integers); the
 * float epilogue is dot_record.h's (q2_k as q6_k's two terms with scales d and -dmin, q3_k
 * as one term with scale d), so the bits depend on K and the values only.
 */
#ifndef EXACTDRAFT_CPU_DOT_K_LOW_H
#define EXACTDRAFT_CPU_DOT_K_LOW_H

#include <string.h>

#define K_LOW(F) ((F) == FORMAT_Q2_K || (F) == FORMAT_Q3_K)
#define K_LOW_BLOCKS 8 /* blocks of 32 per super-block */
#define K_LOW_HEADER_BYTES(F) ((F) == FORMAT_Q2_K ? 4 * DOT_GROUP : 2 * DOT_GROUP)
#define K_LOW_SCALE_BYTES (2 * DOT_GROUP)
#define K_LOW_CODE_CHUNKS(F) ((F) == FORMAT_Q2_K ? 2 : 3)
#define K_LOW_BLOCK_BYTES(F) (K_LOW_SCALE_BYTES + K_LOW_CODE_CHUNKS(F) * DOT_CHUNK)

/* The super-block record holding block b of a group whose records start at `records`. */
static ALWAYS_INLINE const uint8_t *k_low_super_block(const uint8_t *records, size_t record_bytes,
                                                      ptrdiff_t b)
{
    return records + (size_t)(b / K_LOW_BLOCKS) * K_LOW_BLOCKS * record_bytes;
}

/* Block b's scales, then codes, within its super-block record. */
static ALWAYS_INLINE const uint8_t *k_low_block(const int format, const uint8_t *super,
                                                ptrdiff_t b)
{
    return super + K_LOW_HEADER_BYTES(format) + (b % K_LOW_BLOCKS) * K_LOW_BLOCK_BYTES(format);
}

/* The codes of `lane_bytes` / 4 lanes (from `codes`, the lanes' first byte of chunk 0) as one
 * byte each, in the byte formats' chunks at `out` (chunk j at out + j * DOT_CHUNK). Little
 * endian words: a byte's bits never meet another byte's after the masks. */
static ALWAYS_INLINE void k_low_unpack(const int format, const uint8_t *codes, uint8_t *out,
                                       int lane_bytes)
{
    for (int o = 0; o < lane_bytes; o += 8) {
        uint64_t low[2], high = 0;
        memcpy(&low[0], codes + o, 8);
        memcpy(&low[1], codes + DOT_CHUNK + o, 8);
        if (format == FORMAT_Q3_K) memcpy(&high, codes + 2 * DOT_CHUNK + o, 8);
        for (int j = 0; j < 8; j++) {
            uint64_t bytes = (low[j / 4] >> (2 * (j % 4))) & 0x0303030303030303ull;
            if (format == FORMAT_Q3_K) bytes |= ((high >> j) & 0x0101010101010101ull) << 2;
            memcpy(out + j * DOT_CHUNK + o, &bytes, 8);
        }
    }
}

/* A block's integer sub-scales of lanes lane0..lane0 + DOT_VW - 1: scale[0], scale[1] of its
 * weights 0..15 and 16..31, and q2_k's minimum[0], minimum[1]. */
struct k_low_scales {
    vi scale[2];
#ifdef DOT_MINIMUM_PAIRS
    vi minimum_pairs; /* q2_k's m0 | m1 << 16 in each lane: one 16-bit pair product */
#else
    vi minimum[2];
#endif
};

static ALWAYS_INLINE void k_low_load_scales(const int format, const uint8_t *block,
                                            ptrdiff_t lane0, struct k_low_scales *s)
{
#ifdef DOT_K_LOW_PRIMITIVES
    if (format == FORMAT_Q2_K) {
        s->scale[0] = vi_lanes_nibble(block + lane0, 0);
        s->scale[1] = vi_lanes_nibble(block + lane0, 4);
#ifdef DOT_MINIMUM_PAIRS
        s->minimum_pairs = vi_lanes_nibble_pairs(block + DOT_GROUP + lane0);
#else
        s->minimum[0] = vi_lanes_nibble(block + DOT_GROUP + lane0, 0);
        s->minimum[1] = vi_lanes_nibble(block + DOT_GROUP + lane0, 4);
#endif
    } else {
        s->scale[0] = vi_lanes_int8(block + lane0);
        s->scale[1] = vi_lanes_int8(block + DOT_GROUP + lane0);
    }
#else
    int32_t lanes[4][DOT_VW];
    for (int c = 0; c < DOT_VW; c++) {
        if (format == FORMAT_Q2_K) {
            const uint8_t scales = block[lane0 + c], minimums = block[DOT_GROUP + lane0 + c];
            lanes[0][c] = scales & 15;
            lanes[1][c] = scales >> 4;
            lanes[2][c] = minimums & 15;
            lanes[3][c] = minimums >> 4;
        } else {
            lanes[0][c] = (int8_t)block[lane0 + c];
            lanes[1][c] = (int8_t)block[DOT_GROUP + lane0 + c];
        }
    }
    s->scale[0] = vi_lanes_load(lanes[0]);
    s->scale[1] = vi_lanes_load(lanes[1]);
    if (format == FORMAT_Q2_K) {
        s->minimum[0] = vi_lanes_load(lanes[2]);
        s->minimum[1] = vi_lanes_load(lanes[3]);
    }
#endif
}

#ifndef DOT_K_LOW_PRIMITIVES
/* The portable decode of a part's codes (levels without their own dot_load_k_low): unpacked
 * to bytes, then loaded as byte codes. */
static ALWAYS_INLINE void dot_load_k_low(const int format, const uint8_t *chunks,
                                         struct dot_codes *w)
{
    uint8_t unpacked[8 * DOT_CHUNK] __attribute__((aligned(64)));
    k_low_unpack(format, chunks, unpacked, 4 * DOT_VW);
    dot_load_u8(unpacked, w);
}
#endif

/* q2_k's M = m0 sum(x, 0..15) + m1 sum(x, 16..31) of a row whose halves' activation sums are
 * half_sums[0..1] (each |sum| <= 16 * 127, so a 16-bit pair holds them). */
static ALWAYS_INLINE vi k_low_minimums(const struct k_low_scales *s, const int32_t *half_sums)
{
#ifdef DOT_MINIMUM_PAIRS
    return vi_pairs_dot(s->minimum_pairs,
                        (int32_t)((uint32_t)(uint16_t)half_sums[0] |
                                  (uint32_t)half_sums[1] << 16));
#else
    return vi_lanes_add(vi_lanes_mul(s->minimum[0], vi_set1(half_sums[0])),
                        vi_lanes_mul(s->minimum[1], vi_set1(half_sums[1])));
#endif
}

/* Row r's exact block sums from its halves' sums isum0, isum1: *isum = I and, for q2_k,
 * *isum1 = M from the halves' activation sums (q2_k's starts, set_dot_starts). */
static ALWAYS_INLINE void k_low_combine(const int format, const struct k_low_scales *s,
                                        const int32_t *half_sums, vi *isum, vi *isum1)
{
    const vi high = *isum1;
    *isum = vi_lanes_add(vi_lanes_mul(s->scale[0], *isum), vi_lanes_mul(s->scale[1], high));
    if (format == FORMAT_Q2_K) *isum1 = k_low_minimums(s, half_sums);
}

/* Rows' exact sums of a block whose codes are w (rows' activations at x + 32 r, their starts
 * at starts + 2 r): *isum = I, *isum1 = M. From K_LOW_SCALED_ROWS rows on (a level that
 * defines it), q2_k's codes are scaled by their sub-scales once (each product at most 3 * 15
 * fits its byte) instead of every row's two halves: the sums are the same integers. */
static ALWAYS_INLINE void k_low_sums(const int format, const int rows, struct dot_codes *w,
                                     const int8_t *x, const int32_t *starts,
                                     const struct k_low_scales *s, vi *isum, vi *isum1)
{
#ifdef K_LOW_SCALED_ROWS
    if (format == FORMAT_Q2_K && rows >= K_LOW_SCALED_ROWS) {
        dot_scale_halves(w, s->scale[0], s->scale[1]);
        dot_u8_rows(w, x, NULL, rows, isum);
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) isum1[r] = k_low_minimums(s, starts + 2 * r);
        return;
    }
#endif
    /* q3_k's starts take the halves' offset 4 out; q2_k's are its halves' activation sums. */
    dot_u8_halves(w, x, format == FORMAT_Q3_K ? starts : NULL, rows, isum, isum1);
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
        k_low_combine(format, s, starts + 2 * r, &isum[r], &isum1[r]);
}

/* The lanes' super-block scale d, and for q2_k -dmin (second). */
static ALWAYS_INLINE void k_low_parameters(const int format, const uint8_t *super,
                                           ptrdiff_t lane0, dv *scale, dv *second)
{
    *scale = dv_load_half((const uint16_t *)super + lane0);
    *second = format == FORMAT_Q2_K ? dv_load_half((const uint16_t *)super + DOT_GROUP + lane0)
                                    : dv_zero();
}

#endif
