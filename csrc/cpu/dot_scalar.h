/* Integer dot products for the dot layout in plain C, for dot_body.h: 8 weight rows per
 * "vector", one int32 lane each.
 *
 * Invariant: every primitive returns exact integer sums (so the order of the additions is free:
 * lanes run side by side over the block's 32 activations).
 */
#include "kernels.h"
#include <string.h>
#define DOT_TILE_ROWS 2
/* q8_0 codes are read as stored, w + 128, like the other byte codes; the starts take 128 out. */
#define DOT_Q8_CODE_BIAS 128
#define DOT_VW 8

#if SCALAR_VECTOR_TYPES
/* Vector types, as in vec_scalar.h: the lanes stay in registers and run side by side. */
typedef int32_t vi __attribute__((vector_size(DOT_VW * sizeof(int32_t))));
typedef float dv __attribute__((vector_size(DOT_VW * sizeof(float)))); /* a weight row a lane */
#define DOT_LANE(v, i) (v)[i]
#else
typedef struct { int32_t lane[DOT_VW]; } vi;
typedef struct { float lane[DOT_VW]; } dv; /* one weight row per lane */
#define DOT_LANE(v, i) (v).lane[i]
#endif

/* One block's weight codes for DOT_VW rows: lane c of code[k] is row c's code paired with
 * activation k; q4 codes are 0..15, byte codes (q8_0's included) unsigned. */
struct dot_codes {
    vi code[32];
};

#define DV_LANEWISE(expr) do { for (int i = 0; i < DOT_VW; i++) { DOT_LANE(r, i) = (expr); } } while (0)

static inline vi vi_set1(int32_t a) { vi r; DV_LANEWISE(a); return r; }
static inline dv vi_to_dv(vi a) { dv r; DV_LANEWISE((float)DOT_LANE(a, i)); return r; }
static inline dv dv_zero(void) { dv r; DV_LANEWISE(0.0f); return r; }
static inline dv dv_set1(float a) { dv r; DV_LANEWISE(a); return r; }
static inline dv dv_add(dv a, dv b) { dv r; DV_LANEWISE(DOT_LANE(a, i) + DOT_LANE(b, i)); return r; }
static inline dv dv_mul(dv a, dv b) { dv r; DV_LANEWISE(DOT_LANE(a, i) * DOT_LANE(b, i)); return r; }
static inline void dv_store(float *p, dv v) { memcpy(p, &v, sizeof v); }
static inline dv dv_load(const float *p) { dv r; memcpy(&r, p, sizeof r); return r; }
static inline dv dv_load_half(const uint16_t *p)
{
    dv r;
    DV_LANEWISE(half_bits_to_float(p[i]));
    return r;
}

/* Chunk j of the dot layout holds, for each of the DOT_VW rows, the 4 bytes paired with
 * activations 4j..4j+3: read as one little-endian word per lane. */
static inline vi chunk_words(const uint8_t *chunk)
{
    uint32_t words[DOT_VW];
    for (int c = 0; c < DOT_VW; c++)
        words[c] = (uint32_t)chunk[4 * c] | (uint32_t)chunk[4 * c + 1] << 8 |
                   (uint32_t)chunk[4 * c + 2] << 16 | (uint32_t)chunk[4 * c + 3] << 24;
    vi r;
    memcpy(&r, words, sizeof r);
    return r;
}

#if SCALAR_VECTOR_TYPES
/* Lane c of the result: lane c of words shifted right by shift (logically), masked. */
static inline vi vi_field(vi words, int shift, int32_t mask)
{
    typedef uint32_t vu __attribute__((vector_size(DOT_VW * sizeof(uint32_t))));
    return (vi)(((vu)words >> shift) & (uint32_t)mask);
}
/* r + code * x, lanewise. */
static inline vi vi_add_scaled(vi r, vi code, int32_t x) { return r + code * x; }
#else
static inline vi vi_field(vi words, int shift, int32_t mask)
{
    vi r;
    DV_LANEWISE((int32_t)(((uint32_t)DOT_LANE(words, i) >> shift) & (uint32_t)mask));
    return r;
}
static inline vi vi_add_scaled(vi a, vi code, int32_t x)
{
    vi r;
    DV_LANEWISE(DOT_LANE(a, i) + DOT_LANE(code, i) * x);
    return r;
}
#endif

/* Chunk t holds the codes of activations 4t..4t+3 (low nibbles) and 4(t+4).. (high nibbles). */
static inline void dot_load_q4(const uint8_t *chunks, struct dot_codes *w)
{
    for (int t = 0; t < 4; t++) {
        const vi words = chunk_words(chunks + t * DOT_CHUNK);
        for (int i = 0; i < 4; i++) {
            w->code[4 * t + i] = vi_field(words, 8 * i, 0x0f);
            w->code[16 + 4 * t + i] = vi_field(words, 8 * i + 4, 0x0f);
        }
    }
}

/* Unsigned byte codes as stored. */
static inline void dot_load_u8(const uint8_t *chunks, struct dot_codes *w)
{
    for (int j = 0; j < 8; j++) {
        const vi words = chunk_words(chunks + j * DOT_CHUNK);
        for (int i = 0; i < 4; i++) w->code[4 * j + i] = vi_field(words, 8 * i, 0xff);
    }
}

/* 2-bit codes (dot_record.h's crumbs): chunk t (0, 1) holds per row 4 bytes whose bits
 * 2s..2s+1 are the codes of activations 8s+4t..8s+4t+3. */
static inline void dot_load_crumbs(const uint8_t *chunks, struct dot_codes *w)
{
    for (int t = 0; t < 2; t++) {
        const vi words = chunk_words(chunks + t * DOT_CHUNK);
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 4; i++)
                w->code[8 * s + 4 * t + i] = vi_field(words, 8 * i + 2 * s, 3);
    }
}

/* tq1_0: chunk j's codes from a chunk of bytes of five trits (dot_record.h's dot_load_trits):
 * ((v * power mod 256) * 3) >> 8 of each byte v. */
static inline void dot_trit_chunk(const uint8_t *chunk, int power, int j, struct dot_codes *w)
{
    const vi words = chunk_words(chunk);
    for (int b = 0; b < 4; b++) {
        vi r;
        DV_LANEWISE((int32_t)((((((uint32_t)DOT_LANE(words, i) >> (8 * b)) * (uint32_t)power) &
                               0xffu) * 3u) >> 8));
        w->code[4 * j + b] = r;
    }
}

/* q1_0's bits: the one chunk holds per row 4 bytes whose bit s is the bit of activation
 * 4s + i (byte i); the code is twice the bit. */
static inline void dot_load_signs(const uint8_t *chunks, struct dot_codes *w)
{
    const vi words = chunk_words(chunks);
    for (int s = 0; s < 8; s++)
        for (int i = 0; i < 4; i++) {
            const vi bit = vi_field(words, 8 * i + s, 1);
            w->code[4 * s + i] = vi_add_scaled(bit, bit, 1);
        }
}

#define dot_load_q8 dot_load_u8

/* start + the sum over activations [from, to) of code * x. */
static inline vi dot_codes_sum(int32_t start, const struct dot_codes *w, const int8_t *x,
                               int from, int to)
{
    vi r = vi_set1(start);
    for (int k = from; k < to; k++) r = vi_add_scaled(r, w->code[k], x[k]);
    return r;
}

/* isum[r] = starts[2 r] + the sum over the block of code * x_r, row r's activations at
 * x + 32 r. */
static inline void dot_rows(const struct dot_codes *w, const int8_t *x, const int32_t *starts,
                            const int rows, vi *isum)
{
    for (int r = 0; r < rows; r++)
        isum[r] = dot_codes_sum(start_at(starts, 2 * r), w, x + 32 * r, 0, 32);
}

/* As dot_rows over activations 0..15 (isum0) and 16..31 (isum1). */
static inline void dot_u8_halves(const struct dot_codes *w, const int8_t *x,
                                 const int32_t *starts, const int rows, vi *isum0, vi *isum1)
{
    for (int r = 0; r < rows; r++) {
        isum0[r] = dot_codes_sum(start_at(starts, 2 * r), w, x + 32 * r, 0, 16);
        isum1[r] = dot_codes_sum(start_at(starts, 2 * r + 1), w, x + 32 * r, 16, 32);
    }
}

/* Lanewise int32 steps for the q2_k and q3_k sub-scales (dot_k_low.h); all exact. */
static inline vi vi_lanes_load(const int32_t *p) { vi r; memcpy(&r, p, sizeof r); return r; }
static inline vi vi_lanes_mul(vi a, vi b)
{
    vi r;
    DV_LANEWISE(DOT_LANE(a, i) * DOT_LANE(b, i));
    return r;
}
static inline vi vi_lanes_add(vi a, vi b)
{
    vi r;
    DV_LANEWISE(DOT_LANE(a, i) + DOT_LANE(b, i));
    return r;
}

#define dot_q4_rows dot_rows
#define dot_q8_rows dot_rows
#define dot_u8_rows dot_rows

#include "dot_lookup_scalar.h"
