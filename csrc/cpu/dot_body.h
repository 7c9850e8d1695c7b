/* The integer-dot matmul for quantized weights in the dot layout (kernels.h), written once
 * against the vf primitives of a level (vec_*.h) and its integer and "dv" primitives (dot_*.h:
 * DOT_VW-lane float vectors, one weight row per lane); included by kernel_body.h.
 *
 * Invariant: each activation row is quantized on its own (quantize_rows), and output element
 * (m, n) is, whatever the level, tile or thread:
 *     acc = 0; for block b = 0, 1, ... in order:
 *         q8_0, q4_0, q5_0,
 *         tq1_0, tq2_0, q1_0:      acc = acc + (s_w * d_x) * (float)isum
 *         q4_1, q5_1, q4_k, q5_k:  acc = acc + ((s_w * d_x) * (float)isum
 *                                                + m_w * (d_x * (float)sum(q_x)))
 *         q6_k:                    acc = acc + ((s0_w * d_x) * (float)isum0
 *                                                + (s1_w * d_x) * (float)isum1)
 *         q3_k:                    acc = acc + (d_w * d_x) * (float)I
 *         q2_k:                    acc = acc + ((d_w * d_x) * (float)I
 *                                                + (-dmin_w * d_x) * (float)M)
 *     out = acc (+ bias)
 * with s_w, m_w the block's scale and minimum (kernels.h's dot layout; the k formats' d * sc
 * and -dmin * m, exact float32 products formed from the record's integers) and isum the exact
 * integer sum over the block (isum0, isum1 over its weights 0..15 and 16..31) of
 * (code - offset) * q_x, computed from the stored codes and start values (q->starts) that take
 * the offset out (q2_k, q3_k: I and M, dot_k_low.h's exact sums of the sub-scaled halves);
 * each step is one correctly rounded float operation. The integer sums are
 * exact and every level performs the same float steps, so the bits depend on K and the values
 * only.
 */

/* Activation rows [first, end) of p: per block of 32, d = max |x| / 127 and q = x / d rounded
 * to nearest even, clamped to [-127, 127] (NaN gives 0); a block whose d is 0 gets q = 0. The
 * sum of q is exact in float (at most 32 * 127 in magnitude), whatever the order. */
static void quantize_rows(const struct quantize_problem *p, ptrdiff_t first, ptrdiff_t end)
{
    const ptrdiff_t depth = p->depth, blocks = depth / QUANT_BLOCK;
    const struct quantized_rows *out = p->out;
    const vf low = vf_set1(-127.0f), high = vf_set1(127.0f);
    for (ptrdiff_t m = first; m < end; m++) {
        for (ptrdiff_t b = 0; b < blocks; b++) {
            const float *x = p->x + m * depth + b * QUANT_BLOCK;
            const ptrdiff_t index = b * p->rows + m;
            vf v[BLOCK_VECTORS], top = vf_zero();
            for (int i = 0; i < BLOCK_VECTORS; i++) {
                v[i] = vf_load(x + i * VW);
                top = vf_max(top, vf_abs(v[i]));
            }
            const float scale = vf_max_all(top) / 127.0f;
            const vf divisor = vf_set1(scale != 0.0f ? scale : 1.0f);
            int8_t *q = out->values + index * QUANT_BLOCK;
            vf total = vf_zero();
            for (int i = 0; i < BLOCK_VECTORS; i++) {
                vf r = vf_round(vf_div(v[i], divisor));
                r = vf_min(vf_max(vf_select_nan(r, vf_zero(), r), low), high);
                vf_store_int8(q + i * VW, r);
                total = vf_add(total, r);
            }
            const float sum = vf_sum(total);
            out->scales[index] = scale;
            out->sums[index] = (int32_t)sum;
            out->scaled_sums[index] = scale * sum;
        }
    }
}

struct dot_args {
    const uint8_t *records;  /* the group's record for block 0 */
    size_t record_bytes;
    ptrdiff_t lane0;         /* the part's first weight row within its group */
    ptrdiff_t blocks, rows, first_row; /* rows: all rows of the call (the quantized stride) */
    const struct quantized_rows *q;
    const float *bias;       /* the part's first bias value, or NULL */
    float *out;              /* output [first_row, part's first column] */
    ptrdiff_t out_stride;
    int columns;             /* columns of the part that exist, at most DOT_VW */
};

#include "dot_record.h"
#include "dot_k_low.h"
#include "dot_low_bit.h"
#if defined(DOT_SIGN_LOOKUP)
#include "dot_sign_lookup.h"
#endif

/* q2_k and q3_k's block b (dot_k_low.h): its parameters and each row's exact sums. */
static ALWAYS_INLINE void dot_k_low_sums(const int format, const int rows,
                                          const struct dot_args *a, ptrdiff_t b, dv *scale,
                                          dv *second, vi *isum, vi *isum1)
{
    const struct quantized_rows *q = a->q;
    const uint8_t *super = k_low_super_block(a->records, a->record_bytes, b);
    const uint8_t *block = k_low_block(format, super, b);
    /* The super-block's d (and -dmin) serve its 8 blocks: read at its first. */
    if (b % K_LOW_BLOCKS == 0) k_low_parameters(format, super, a->lane0, scale, second);
    struct dot_codes w;
    dot_load_k_low(format, block + K_LOW_SCALE_BYTES + 4 * a->lane0, &w);
    const ptrdiff_t first = b * a->rows + a->first_row;
    struct k_low_scales scales;
    k_low_load_scales(format, block, a->lane0, &scales);
    k_low_sums(format, rows, &w, q->values + first * QUANT_BLOCK, q->starts + 2 * first,
               &scales, isum, isum1);
}

static ALWAYS_INLINE void dot_tile(const int format, const int rows, const struct dot_args *a)
{
    const struct quantized_rows *q = a->q;
    dv acc[DOT_TILE_ROWS];
    dv super_scale = dv_zero(), super_second = dv_zero(); /* q2_k and q3_k's d and -dmin */
    /* Unrolled row loops keep every accumulator in a register. */
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) acc[r] = dv_zero();
    for (ptrdiff_t b = 0; b < a->blocks; b++) {
        const uint8_t *next = a->records + (b + DOT_PREFETCH_RECORDS) * a->record_bytes;
        const uint8_t *record = dot_record_parameters(format, a->records, b, a->record_bytes);
        const uint8_t *codes = dot_record_codes(format, record, b);
        /* The records stream from memory: ask for them well ahead of use (past the end of the
         * weights a prefetch is only a hint, never a fault). */
        if (a->lane0 == 0)
            for (size_t line = 0; line < a->record_bytes; line += 64)
                __builtin_prefetch(next + line);
        if (K_LOW(format)) {
            vi isum[DOT_TILE_ROWS], isum1[DOT_TILE_ROWS];
            dot_k_low_sums(format, rows, a, b, &super_scale, &super_second, isum, isum1);
            const ptrdiff_t first = b * a->rows + a->first_row;
#pragma GCC unroll 8
            for (int r = 0; r < rows; r++)
                acc[r] = dv_add(acc[r], dot_block_term(format, super_scale, super_second, q,
                                                       first + r, isum[r], &isum1[r]));
            continue;
        }
        const dv scale = dot_parameter(format, record, codes, 0, a->lane0);
        dv second = dv_zero();
        if (HAS_MINIMUM(format) || format == FORMAT_Q6_K)
            second = dot_parameter(format, record, codes, 1, a->lane0);
        struct dot_codes w;
        const ptrdiff_t first = b * a->rows + a->first_row;
        const int8_t *x = q->values + first * QUANT_BLOCK;
        /* NULL where every start is 0: the codes carry no offset (a compile-time constant). */
        const int32_t *starts = CODE_OFFSET(format) ? q->starts + 2 * first : NULL;
        vi isum[DOT_TILE_ROWS], isum1[DOT_TILE_ROWS];
        if (LOOKUP_CODES(format)) {
            dot_load_lookup(lookup_values(format), codes + 4 * a->lane0, &w);
            dot_lookup_rows(&w, x, starts, rows, isum);
        } else if (NIBBLE_CODES(format)) {
            dot_load_q4(codes + 4 * a->lane0, &w);
            dot_q4_rows(&w, x, starts, rows, isum);
        } else if (format == FORMAT_Q8_0) {
            dot_load_q8(codes + 4 * a->lane0, &w);
            dot_q8_rows(&w, x, starts, rows, isum);
        } else if (CRUMB_CODES(format)) {
            dot_crumb_rows(codes + 4 * a->lane0, x, starts, rows, isum);
        } else if (TRIT_CODES(format)) {
            dot_load_trits(codes + 4 * a->lane0, (int)(b % 8), &w);
            dot_u8_rows(&w, x, starts, rows, isum);
        } else if (SIGN_CODES(format)) {
            dot_load_signs(codes + 4 * a->lane0, &w);
            dot_u8_rows(&w, x, starts, rows, isum);
        } else { /* 5- and 6-bit codes */
#if defined(DOT_LOAD_HIGH)
            dot_load_high(format, codes + 4 * a->lane0, &w);
#else
            uint8_t unpacked[8 * DOT_CHUNK] __attribute__((aligned(64)));
            dot_unpack_high(format, codes + 4 * a->lane0, unpacked, 4 * DOT_VW);
            dot_load_u8(unpacked, &w);
#endif
            if (format == FORMAT_Q6_K) dot_u8_halves(&w, x, starts, rows, isum, isum1);
            else dot_u8_rows(&w, x, starts, rows, isum);
        }
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++)
            acc[r] = dv_add(acc[r], dot_block_term(format, scale, second, q, first + r, isum[r],
                                                   &isum1[r]));
    }
    for (int r = 0; r < rows; r++)
        dot_store_row(acc[r], a->bias, a->out + r * a->out_stride, a->columns);
}

typedef void (*dot_function)(const struct dot_args *a);

/* Only the row counts this level reaches are instantiated (each is a full copy of the kernel). */
#define DOT_INSTANCE(F, R) \
    static void dot_##F##_##R(const struct dot_args *a) { dot_tile(F, R, a); }
#if DOT_TILE_ROWS == 2
#define DOT_INSTANCES(F) DOT_INSTANCE(F, 1) DOT_INSTANCE(F, 2)
#define DOT_TABLE(F) {dot_##F##_1, dot_##F##_2}
#elif DOT_TILE_ROWS == 4
#define DOT_INSTANCES(F) DOT_INSTANCE(F, 1) DOT_INSTANCE(F, 2) DOT_INSTANCE(F, 3) DOT_INSTANCE(F, 4)
#define DOT_TABLE(F) {dot_##F##_1, dot_##F##_2, dot_##F##_3, dot_##F##_4}
#elif DOT_TILE_ROWS == 8
#define DOT_INSTANCES(F) \
    DOT_INSTANCE(F, 1) DOT_INSTANCE(F, 2) DOT_INSTANCE(F, 3) DOT_INSTANCE(F, 4) \
    DOT_INSTANCE(F, 5) DOT_INSTANCE(F, 6) DOT_INSTANCE(F, 7) DOT_INSTANCE(F, 8)
#define DOT_TABLE(F) \
    {dot_##F##_1, dot_##F##_2, dot_##F##_3, dot_##F##_4, dot_##F##_5, dot_##F##_6, \
     dot_##F##_7, dot_##F##_8}
#else
#error "DOT_TILE_ROWS must be 2, 4 or 8"
#endif

#if DOT_GROUP % DOT_VW
#error "a part of DOT_VW columns must not straddle two groups"
#endif

DOT_INSTANCES(2) DOT_INSTANCES(3) DOT_INSTANCES(4) DOT_INSTANCES(5) DOT_INSTANCES(6)
DOT_INSTANCES(7) DOT_INSTANCES(8) DOT_INSTANCES(9)
DOT_INSTANCES(10) DOT_INSTANCES(11) DOT_INSTANCES(12) DOT_INSTANCES(13) DOT_INSTANCES(14)
DOT_INSTANCES(15) DOT_INSTANCES(16) DOT_INSTANCES(17)

/* By format code minus FORMAT_Q8_0 (the quantized formats are codes 2 and up). */
static const dot_function dot_tiles[FORMAT_COUNT - FORMAT_Q8_0][DOT_TILE_ROWS] = {
    DOT_TABLE(2), DOT_TABLE(3), DOT_TABLE(4), DOT_TABLE(5), DOT_TABLE(6), DOT_TABLE(7),
    DOT_TABLE(8), DOT_TABLE(9), DOT_TABLE(10), DOT_TABLE(11), DOT_TABLE(12), DOT_TABLE(13),
    DOT_TABLE(14), DOT_TABLE(15), DOT_TABLE(16), DOT_TABLE(17)};

/* All rows of output columns [first, end), first a multiple of DOT_GROUP, in parts of DOT_VW
 * columns; each part reads a block's weights once for a tile of DOT_TILE_ROWS rows. Lanes are
 * weight rows and never meet, so DOT_VW decides the speed, not the bits. */
static void dot_matmul_columns(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end)
{
    const ptrdiff_t blocks = p->depth / QUANT_BLOCK;
    struct dot_args a = {.record_bytes = (size_t)FORMAT_ROWS[p->format].dot_record_bytes,
                         .blocks = blocks,
                         .rows = p->rows, .q = p->quantized, .out_stride = p->out_stride ? p->out_stride : p->columns};
#if defined(DOT_SIGN_LOOKUP)
    if (p->format == FORMAT_Q1_0 && p->quantized->sign_tables && p->rows <= DOT_TILE_ROWS) {
        dot_sign_columns(p, first, end, a);
        return;
    }
#endif
    for (ptrdiff_t n = first; n < end; n += DOT_VW) {
        const ptrdiff_t group = n / DOT_GROUP;
        a.records = p->weight + (size_t)(group * blocks) * a.record_bytes;
        a.lane0 = n % DOT_GROUP;
        a.columns = (int)min_index(DOT_VW, end - n);
        a.bias = p->bias ? p->bias + n : NULL;
        for (ptrdiff_t m = 0; m < p->rows; m += DOT_TILE_ROWS) {
            const int rows = (int)min_index(DOT_TILE_ROWS, p->rows - m);
            a.first_row = m;
            a.out = p->out + m * a.out_stride + n;
            dot_tiles[p->format - FORMAT_Q8_0][rows - 1](&a);
        }
    }
}
