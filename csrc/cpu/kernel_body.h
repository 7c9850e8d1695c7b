/* The kernels, written once against the vf primitives of one SIMD level (vec_*.h) and compiled
 * once per level by the level_*.c files, which name the table with KERNEL_TABLE. Attention is in
 * attention_body.h; a level that also includes integer primitives (dot_*.h) gets the
 * integer-dot matmul of dot_body.h.
 *
 * Invariant: the arithmetic of one output element depends only on the reduced length and the
 * format:
 * - matmul: lane l of an accumulator adds x[k] * w[k] for k = l, l + VW, l + 2 VW, ... in
 *   increasing k with one fused multiply-add each, then the lanes meet in vf_sum's fixed tree
 *   and the bias is added. Tiles of TILE_ROWS x TILE_COLUMNS outputs only decide which outputs
 *   share a sweep over K; every tile size runs the same per-element sequence.
 * - attention: keys are cut into KEY_TILE tiles aligned to absolute positions; a tile holds only
 *   the row's visible keys, tiles are merged by an online softmax in position order, so nothing
 *   past the row's own position (cache capacity, other rows) is ever read (attention_body.h).
 * - elementwise ops run every element, tails included, through the same vector code (a tail is
 *   a zero-padded partial vector), so an element's bits never depend on where it sits.
 */
#include <math.h>
#include <string.h>

#include "fp8_e4m3.h"
#include "kernels.h"

#define BLOCK_VECTORS (QUANT_BLOCK / VW)
#define ROW_BLOCK 32

static ALWAYS_INLINE ptrdiff_t min_index(ptrdiff_t a, ptrdiff_t b) { return a < b ? a : b; }

/* exp with a degree-7 Taylor polynomial on [-ln2/2, ln2/2]; within 2 ulp on normal results.
 * Results below the smallest normal float are 0 and inputs above 88.37 give +inf. */
static ALWAYS_INLINE vf vector_exp(vf x)
{
    const vf high = vf_set1(88.37f), low = vf_set1(-87.33654f);
    vf clamped = vf_min(vf_max(x, low), high);
    vf n = vf_round(vf_mul(clamped, vf_set1(1.44269504f)));
    vf r = vf_fma(n, vf_set1(-0.693359375f), clamped);
    r = vf_fma(n, vf_set1(2.12194440e-4f), r);
    vf p = vf_set1(1.0f / 5040.0f);
    p = vf_fma(p, r, vf_set1(1.0f / 720.0f));
    p = vf_fma(p, r, vf_set1(1.0f / 120.0f));
    p = vf_fma(p, r, vf_set1(1.0f / 24.0f));
    p = vf_fma(p, r, vf_set1(1.0f / 6.0f));
    p = vf_fma(p, r, vf_set1(0.5f));
    p = vf_fma(p, r, vf_set1(1.0f));
    p = vf_fma(p, r, vf_set1(1.0f));
    p = vf_mul(p, vf_pow2n(n));
    p = vf_select_greater(x, high, vf_set1(INFINITY), p);
    p = vf_select_greater(low, x, vf_zero(), p);
    return vf_select_nan(x, x, p);
}

/* ---------------------------------------------------------------------------------------- */
/* matmul                                                                                   */

struct tile_args {
    const float *x;
    const uint8_t *weight;   /* block 0 of the tile's first column */
    const float *bias;       /* the tile's first bias value, or NULL */
    float *out;              /* the tile's first output */
    ptrdiff_t depth, x_stride, out_stride;
    size_t column_stride;    /* bytes from a block of one column to that of the next */
    size_t block_stride;     /* bytes from one block of a column to its next */
};


/* Weights k = 32 block .. 32 block + 31 of one row as floats: exact, except q4_1's d q + m, which
 * is rounded once (as gguf's own dequantization does), and fp8_e4m3's code times scale, rounded
 * once (as the checkpoint's block dequantization does). */
static ALWAYS_INLINE void decode_block(const int format, const uint8_t *p, vf w[BLOCK_VECTORS])
{
    if (format == FORMAT_F32) {
        for (int v = 0; v < BLOCK_VECTORS; v++) w[v] = vf_load((const float *)p + v * VW);
    } else if (format == FORMAT_BF16) {
        for (int v = 0; v < BLOCK_VECTORS; v++) w[v] = vf_load_bf16((const uint16_t *)p + v * VW);
    } else if (format == FORMAT_Q8_0) {
        vf scale = vf_set1(half_to_float(p));
        vf_decode_int8(p + 2, w);
        for (int v = 0; v < BLOCK_VECTORS; v++) w[v] = vf_mul(w[v], scale);
    } else if (format == FORMAT_Q4_0) {
        /* (q - 8) d == q d - 8 d exactly: both are small integers times a half. */
        const float scale = half_to_float(p);
        vf_decode_q4(p + 2, vf_set1(scale), vf_set1(-8.0f * scale), w);
    } else if (format == FORMAT_FP8_E4M3) {
        /* bfloat16 bits as if every code were normal (fp8_e4m3.h); below 2^-6 in magnitude
         * only the codes of exponent 0, whose 2^-7 (1 + m / 8) becomes m 2^-9 = 2 a - 2^-6
         * (exact: Sterbenz). The sign joins through the scale: v (-s) == -(v s), and code 0x80
         * gives +0 (-s) = -0, the product the float32 path forms from -0.0. */
        uint16_t halves[QUANT_BLOCK];
        e4m3_block_halves(p, halves);
        const float scale = e4m3_block_scale(p);
        const vf smallest_normal = vf_set1(0x1p-6f), plus = vf_set1(scale),
                 minus = vf_set1(-scale), zero = vf_zero();
        for (int v = 0; v < BLOCK_VECTORS; v++) {
            const vf f = vf_load_bf16(halves + v * VW), a = vf_abs(f);
            const vf small = vf_sub(vf_add(a, a), smallest_normal);
            const vf magnitude = vf_select_greater(smallest_normal, a, small, a);
            w[v] = vf_mul(magnitude, vf_select_greater(zero, f, minus, plus));
        }
    } else {
        vf_decode_q4(p + 4, vf_set1(half_to_float(p)), vf_set1(half_to_float(p + 2)), w);
    }
}

/* Up to VW weights of a dense row from element k on, zero filled past n. */
static ALWAYS_INLINE vf load_dense_partial(const int format, const uint8_t *row, ptrdiff_t k,
                                           int n)
{
    if (format == FORMAT_F32) return vf_load_partial((const float *)row + k, n);
    uint16_t lanes[VW] = {0};
    memcpy(lanes, (const uint16_t *)row + k, (size_t)n * sizeof(uint16_t));
    return vf_load_bf16(lanes);
}

static ALWAYS_INLINE void tile_kernel(const int format, const int rows, const int columns,
                                      const struct tile_args *a)
{
    vf acc[4][4];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < columns; c++) acc[r][c] = vf_zero();
    const ptrdiff_t blocks = a->depth / QUANT_BLOCK;
    for (ptrdiff_t b = 0; b < blocks; b++) {
        vf w[4][BLOCK_VECTORS];
        const uint8_t *blocks = a->weight + b * a->block_stride;
        for (int c = 0; c < columns; c++) decode_block(format, blocks + c * a->column_stride, w[c]);
        for (int r = 0; r < rows; r++) {
            const float *xr = a->x + r * a->x_stride + b * QUANT_BLOCK;
            for (int v = 0; v < BLOCK_VECTORS; v++) {
                vf xv = vf_load(xr + v * VW);
                for (int c = 0; c < columns; c++) acc[r][c] = vf_fma(xv, w[c][v], acc[r][c]);
            }
        }
    }
    if (format == FORMAT_F32 || format == FORMAT_BF16) {
        for (ptrdiff_t k = blocks * QUANT_BLOCK; k < a->depth; k += VW) {
            int n = (int)min_index(VW, a->depth - k);
            vf w[4];
            for (int c = 0; c < columns; c++)
                w[c] = load_dense_partial(format, a->weight + c * a->column_stride, k, n);
            for (int r = 0; r < rows; r++) {
                vf xv = vf_load_partial(a->x + r * a->x_stride + k, n);
                for (int c = 0; c < columns; c++) acc[r][c] = vf_fma(xv, w[c], acc[r][c]);
            }
        }
    }
    /* A full tile of VW accumulators meets in one vf_sum_lanes (lane k has vf_sum's bits). */
    float sums[VW];
    if (rows * columns == VW) {
        vf parts[VW];
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < columns; c++) parts[r * columns + c] = acc[r][c];
        vf_store(sums, vf_sum_lanes(parts));
    }
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < columns; c++) {
            float total = rows * columns == VW ? sums[r * columns + c] : vf_sum(acc[r][c]);
            if (a->bias) total += a->bias[c];
            a->out[r * a->out_stride + c] = total;
        }
    }
}

typedef void (*tile_function)(const struct tile_args *a);

/* Only the tile sizes this level reaches are instantiated (each is a full copy of the kernel). */
#define TILE_INSTANCE(F, R, C) \
    static void tile_##F##_##R##_##C(const struct tile_args *a) { tile_kernel(F, R, C, a); }
#if TILE_COLUMNS == 1
#define ROW_INSTANCES(F, R) TILE_INSTANCE(F, R, 1)
#define ROW_TABLE(F, R) {tile_##F##_##R##_1}
#elif TILE_COLUMNS == 2
#define ROW_INSTANCES(F, R) TILE_INSTANCE(F, R, 1) TILE_INSTANCE(F, R, 2)
#define ROW_TABLE(F, R) {tile_##F##_##R##_1, tile_##F##_##R##_2}
#elif TILE_COLUMNS == 4
#define ROW_INSTANCES(F, R) \
    TILE_INSTANCE(F, R, 1) TILE_INSTANCE(F, R, 2) TILE_INSTANCE(F, R, 3) TILE_INSTANCE(F, R, 4)
#define ROW_TABLE(F, R) {tile_##F##_##R##_1, tile_##F##_##R##_2, tile_##F##_##R##_3, \
                         tile_##F##_##R##_4}
#else
#error "TILE_COLUMNS must be 1, 2 or 4 (a column tile must not straddle two weight groups)"
#endif
#if TILE_ROWS == 1
#define FORMAT_INSTANCES(F) ROW_INSTANCES(F, 1)
#define FORMAT_TABLE(F) {ROW_TABLE(F, 1)}
#elif TILE_ROWS == 2
#define FORMAT_INSTANCES(F) ROW_INSTANCES(F, 1) ROW_INSTANCES(F, 2)
#define FORMAT_TABLE(F) {ROW_TABLE(F, 1), ROW_TABLE(F, 2)}
#elif TILE_ROWS == 4
#define FORMAT_INSTANCES(F) \
    ROW_INSTANCES(F, 1) ROW_INSTANCES(F, 2) ROW_INSTANCES(F, 3) ROW_INSTANCES(F, 4)
#define FORMAT_TABLE(F) {ROW_TABLE(F, 1), ROW_TABLE(F, 2), ROW_TABLE(F, 3), ROW_TABLE(F, 4)}
#else
#error "TILE_ROWS must be 1, 2 or 4"
#endif

FORMAT_INSTANCES(0) FORMAT_INSTANCES(1) FORMAT_INSTANCES(2) FORMAT_INSTANCES(3)
FORMAT_INSTANCES(4)
FORMAT_INSTANCES(FORMAT_FP8_E4M3)

/* The float kernels' formats only, by FLOAT_FORMAT_INDEX (formats.h). */
static const tile_function tiles[FLOAT_FORMAT_COUNT][TILE_ROWS][TILE_COLUMNS] = {
    FORMAT_TABLE(0), FORMAT_TABLE(1), FORMAT_TABLE(2), FORMAT_TABLE(3), FORMAT_TABLE(4),
    FORMAT_TABLE(FORMAT_FP8_E4M3),
};

#if WEIGHT_GROUP % TILE_COLUMNS
#error "a column tile must not straddle two weight groups"
#endif


/* All rows of output columns [first, end), first a multiple of TILE_COLUMNS. Rows are swept in
 * blocks of ROW_BLOCK so that a column tile's weights are read from memory once per block and
 * the block's inputs stay in cache. */
static void matmul_columns(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end)
{
    const size_t block_bytes = BYTES_PER_32(p->format);
    struct tile_args a = {.depth = p->depth, .x_stride = p->depth, .out_stride = p->out_stride ? p->out_stride : p->columns,
                          .column_stride = p->row_bytes, .block_stride = block_bytes};
    for (ptrdiff_t m0 = 0; m0 < p->rows; m0 += ROW_BLOCK) {
        ptrdiff_t m1 = min_index(p->rows, m0 + ROW_BLOCK);
        for (ptrdiff_t n = first; n < end; n += TILE_COLUMNS) {
            int columns = (int)min_index(TILE_COLUMNS, end - n);
            if (p->layout == LAYOUT_GROUPED) {
                /* Blocks of a group's rows alternate, so a tile reads one sequential stream. */
                ptrdiff_t group_start = n / WEIGHT_GROUP * WEIGHT_GROUP;
                ptrdiff_t group_rows = min_index(WEIGHT_GROUP, p->columns - group_start);
                a.weight = p->weight + group_start * p->row_bytes + (n - group_start) * block_bytes;
                a.column_stride = block_bytes;
                a.block_stride = (size_t)group_rows * block_bytes;
            } else {
                a.weight = p->weight + n * p->row_bytes;
            }
            a.bias = p->bias ? p->bias + n : NULL;
            for (ptrdiff_t m = m0; m < m1; m += TILE_ROWS) {
                int rows = (int)min_index(TILE_ROWS, m1 - m);
                a.x = p->x + m * p->depth;
                a.out = p->out + m * a.out_stride + n;
                tiles[FLOAT_FORMAT_INDEX(p->format)][rows - 1][columns - 1](&a);
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* attention                                                                                */

#include "attention_body.h"

/* ---------------------------------------------------------------------------------------- */
/* row-wise and elementwise ops                                                             */

static void rms_norm_rows(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end)
{
    const ptrdiff_t width = p->width, vectors = width / VW;
    const int tail = (int)(width % VW);
    for (ptrdiff_t m = first; m < end; m++) {
        const float *x = p->x + m * width;
        float *out = p->out + m * width;
        vf squares = vf_zero();
        for (ptrdiff_t v = 0; v < vectors; v++) {
            vf xv = vf_load(x + v * VW);
            squares = vf_fma(xv, xv, squares);
        }
        if (tail) {
            vf xv = vf_load_partial(x + vectors * VW, tail);
            squares = vf_fma(xv, xv, squares);
        }
        const vf norm = vf_set1(sqrtf(vf_sum(squares) / (float)width + p->eps));
        for (ptrdiff_t v = 0; v < vectors; v++)
            vf_store(out + v * VW, vf_mul(vf_load(p->weight + v * VW),
                                          vf_div(vf_load(x + v * VW), norm)));
        if (tail) {
            vf normed = vf_div(vf_load_partial(x + vectors * VW, tail), norm);
            vf_store_partial(out + vectors * VW,
                             vf_mul(vf_load_partial(p->weight + vectors * VW, tail), normed), tail);
        }
    }
}

/* Rotate-half RoPE of a span of `n` lanes (n <= VW) or a full vector when n == VW. */
static ALWAYS_INLINE void rope_span(const float *x, const float *cos, const float *sin, float *out,
                                    ptrdiff_t half, int n)
{
    vf first = n == VW ? vf_load(x) : vf_load_partial(x, n);
    vf second = n == VW ? vf_load(x + half) : vf_load_partial(x + half, n);
    vf c = n == VW ? vf_load(cos) : vf_load_partial(cos, n);
    vf s = n == VW ? vf_load(sin) : vf_load_partial(sin, n);
    vf low = vf_sub(vf_mul(first, c), vf_mul(second, s));
    vf high = vf_add(vf_mul(second, c), vf_mul(first, s));
    if (n == VW) {
        vf_store(out, low);
        vf_store(out + half, high);
    } else {
        vf_store_partial(out, low, n);
        vf_store_partial(out + half, high, n);
    }
}

static void rope_rows(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end)
{
    const ptrdiff_t dim = p->width, half = dim / 2, vectors = half / VW;
    const int tail = (int)(half % VW);
    for (ptrdiff_t m = first; m < end; m++) {
        const float *cos = p->weight + m * half, *sin = p->weight2 + m * half;
        for (ptrdiff_t h = 0; h < p->heads; h++) {
            const float *x = p->x + (m * p->heads + h) * dim;
            float *out = p->out + (m * p->heads + h) * dim;
            for (ptrdiff_t v = 0; v < vectors; v++)
                rope_span(x + v * VW, cos + v * VW, sin + v * VW, out + v * VW, half, VW);
            if (tail) {
                const ptrdiff_t o = vectors * VW;
                rope_span(x + o, cos + o, sin + o, out + o, half, tail);
            }
        }
    }
}

static ALWAYS_INLINE vf silu_times(vf gate, vf up)
{
    vf sigmoid_denominator = vf_add(vf_set1(1.0f), vector_exp(vf_sub(vf_zero(), gate)));
    return vf_mul(vf_div(gate, sigmoid_denominator), up);
}

/* gelu_tanh(x) = x / 2 (1 + tanh(u)) = x sigmoid(2 u), u = sqrt(2 / pi) (x + 0.044715 x^3):
 * written as x / (1 + exp(-2 u)) with 2 u = x (2 sqrt(2 / pi)) (1 + 0.044715 x x). */
static ALWAYS_INLINE vf gelu_times(vf gate, vf up)
{
    vf inner = vf_mul(vf_mul(gate, vf_set1(1.5957691216057308f)),
                      vf_add(vf_set1(1.0f), vf_mul(vf_mul(vf_set1(0.044715f), gate), gate)));
    vf denominator = vf_add(vf_set1(1.0f), vector_exp(vf_sub(vf_zero(), inner)));
    return vf_mul(vf_div(gate, denominator), up);
}

/* act(gate) * up for rows [first, end) of gate_up [M, 2I]; every element, tails included, runs
 * through the same vector code. */
static ALWAYS_INLINE void gated_rows(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end,
                                     const int gelu)
{
    const ptrdiff_t width = p->width, vectors = width / VW;
    const int tail = (int)(width % VW);
    for (ptrdiff_t m = first; m < end; m++) {
        const float *gate = p->x + m * 2 * width, *up = gate + width;
        float *out = p->out + m * width;
        for (ptrdiff_t v = 0; v < vectors; v++) {
            vf g = vf_load(gate + v * VW), u = vf_load(up + v * VW);
            vf_store(out + v * VW, gelu ? gelu_times(g, u) : silu_times(g, u));
        }
        if (tail) {
            const ptrdiff_t o = vectors * VW;
            vf g = vf_load_partial(gate + o, tail), u = vf_load_partial(up + o, tail);
            vf_store_partial(out + o, gelu ? gelu_times(g, u) : silu_times(g, u), tail);
        }
    }
}

static void silu_mul_rows(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end)
{
    gated_rows(p, first, end, 0);
}

static void gelu_mul_rows(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end)
{
    gated_rows(p, first, end, 1);
}

#if defined(DOT_TILE_ROWS)
#include "dot_body.h"
#endif

const struct kernel_table KERNEL_TABLE = {
    .name = LEVEL_NAME,
    .column_tile = TILE_COLUMNS,
    .matmul_columns = matmul_columns,
    .attention_groups = attention_groups,
    .rms_norm_rows = rms_norm_rows,
    .rope_rows = rope_rows,
    .silu_mul_rows = silu_mul_rows,
    .gelu_mul_rows = gelu_mul_rows,
#if defined(DOT_TILE_ROWS)
    .quantize_rows = quantize_rows,
    .dot_matmul_columns = dot_matmul_columns,
    .q8_code_bias = DOT_Q8_CODE_BIAS,
#endif
#if defined(DOT_SIGN_LOOKUP)
    .build_sign_tables = build_sign_tables,
    .sign_lookup_rows = DOT_TILE_ROWS,
#endif
};
