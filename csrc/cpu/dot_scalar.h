/* Integer dot products for the dot layout in plain C, for dot_body.h: 8 weight rows per
 * "vector", one int32 lane each.
 *
 * Invariant: every primitive returns exact integer sums.
 */
#include "kernels.h"
#include <string.h>
#define DOT_TILE_ROWS 2
#define DOT_Q8_CODE_BIAS 0
#define DOT_VW 8

typedef struct { int32_t lane[DOT_VW]; } vi;
typedef struct { float lane[DOT_VW]; } dv; /* one weight row per lane */

/* One block's weight codes for DOT_VW rows: code[j][c] holds row c's 4 codes paired with
 * activations 4j..4j+3; q4 codes are 0..15, q8_0 codes are the signed weights. */
struct dot_codes {
    int16_t code[8][DOT_VW][4];
};

#define DV_LANEWISE(expr) do { for (int i = 0; i < DOT_VW; i++) { r.lane[i] = (expr); } } while (0)

static inline vi vi_set1(int32_t a)
{
    vi r;
    DV_LANEWISE(a);
    return r;
}

static inline dv vi_to_dv(vi a) { dv r; DV_LANEWISE((float)a.lane[i]); return r; }
static inline dv dv_zero(void) { dv r; DV_LANEWISE(0.0f); return r; }
static inline dv dv_set1(float a) { dv r; DV_LANEWISE(a); return r; }
static inline dv dv_add(dv a, dv b) { dv r; DV_LANEWISE(a.lane[i] + b.lane[i]); return r; }
static inline dv dv_mul(dv a, dv b) { dv r; DV_LANEWISE(a.lane[i] * b.lane[i]); return r; }
static inline void dv_store(float *p, dv v) { memcpy(p, v.lane, sizeof v.lane); }
static inline dv dv_load(const float *p) { dv r; memcpy(r.lane, p, sizeof r.lane); return r; }
static inline dv dv_load_half(const uint16_t *p)
{
    dv r;
    DV_LANEWISE(half_bits_to_float(p[i]));
    return r;
}

static inline void dot_load_q4(const uint8_t *chunks, struct dot_codes *w)
{
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < DOT_VW; c++)
            for (int i = 0; i < 4; i++) {
                uint8_t byte = chunks[t * DOT_CHUNK + 4 * c + i];
                w->code[t][c][i] = (int16_t)(byte & 0x0f);
                w->code[t + 4][c][i] = (int16_t)(byte >> 4);
            }
}

/* Unsigned byte codes as stored. */
static inline void dot_load_u8(const uint8_t *chunks, struct dot_codes *w)
{
    for (int j = 0; j < 8; j++)
        for (int c = 0; c < DOT_VW; c++)
            for (int i = 0; i < 4; i++) w->code[j][c][i] = chunks[j * DOT_CHUNK + 4 * c + i];
}

static inline void dot_load_q8(const uint8_t *chunks, struct dot_codes *w)
{
    for (int j = 0; j < 8; j++)
        for (int c = 0; c < DOT_VW; c++)
            for (int i = 0; i < 4; i++)
                w->code[j][c][i] = (int16_t)((int)chunks[j * DOT_CHUNK + 4 * c + i] - 128);
}

/* start + the sum over chunks [from, to) of code * x. */
static inline vi dot_codes_sum(vi start, const struct dot_codes *w, const int8_t *x, int from,
                               int to)
{
    vi r;
    for (int c = 0; c < DOT_VW; c++) {
        int32_t total = start.lane[c];
        for (int j = from; j < to; j++)
            for (int i = 0; i < 4; i++) total += (int32_t)w->code[j][c][i] * x[4 * j + i];
        r.lane[c] = total;
    }
    return r;
}

/* isum[r] = starts[2 r] + the sum over the block of code * x_r, row r's activations at
 * x + 32 r; q4 codes are 0..15, q8_0 codes the signed weights, byte codes unsigned. */
static inline void dot_rows(const struct dot_codes *w, const int8_t *x, const int32_t *starts,
                            const int rows, vi *isum)
{
    for (int r = 0; r < rows; r++)
        isum[r] = dot_codes_sum(vi_set1(starts[2 * r]), w, x + 32 * r, 0, 8);
}

/* As dot_rows over activations 0..15 (isum0) and 16..31 (isum1). */
static inline void dot_u8_halves(const struct dot_codes *w, const int8_t *x,
                                 const int32_t *starts, const int rows, vi *isum0, vi *isum1)
{
    for (int r = 0; r < rows; r++) {
        isum0[r] = dot_codes_sum(vi_set1(starts[2 * r]), w, x + 32 * r, 0, 4);
        isum1[r] = dot_codes_sum(vi_set1(starts[2 * r + 1]), w, x + 32 * r, 4, 8);
    }
}

#define dot_q4_rows dot_rows
#define dot_q8_rows dot_rows
#define dot_u8_rows dot_rows
