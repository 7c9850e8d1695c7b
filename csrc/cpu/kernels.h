/* Shared declarations of the row-invariant CPU kernels.
 *
 * Invariant: every output element is computed by one fixed sequence of IEEE operations chosen
 * by the problem's shape along the reduced dimension (K for matmul, D and the row's own position
 * for attention) and the SIMD level picked once per process. Row count, a row's place in the
 * pass, tiling, work partition and thread count change which core runs an element and in what
 * order elements are visited, never the arithmetic of one element. The integer-dot matmul
 * (LAYOUT_DOT) goes further: its integer sums are exact and its float steps are the same on
 * every level, so its bits do not depend on the SIMD level either.
 */
#ifndef EXACTDRAFT_CPU_KERNELS_H
#define EXACTDRAFT_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "formats.h"

enum weight_layout { LAYOUT_ROWS = 0, LAYOUT_GROUPED = 1, LAYOUT_DOT = 2, LAYOUT_COUNT = 3 };

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* A dot row function's start starts[i], where starts is NULL when every start is 0 (the codes
 * carry no offset: dot_body.h's CODE_OFFSET). */
static ALWAYS_INLINE int32_t start_at(const int32_t *starts, int i)
{
    return starts ? starts[i] : 0;
}

/* Quantized formats hold blocks of 32 weights along K. */
#define QUANT_BLOCK 32
/* The dot layout (quantized formats only) stores the weight rows in groups of DOT_GROUP: for
 * group g and block b of 32 weights, one record (FORMAT_ROWS' dot_record_bytes) holds the
 * group's 16 block parameters, then the weight codes in chunks of 64 bytes, 4 bytes per row.
 * Every format reads as w = scale * (code - offset) + minimum, code an unsigned integer:
 * - parameters: q8_0, q4_0, q5_0: 16 float16 scales; q4_1, q5_1: 16 float16 scales, then 16
 *   float16 minimums; q4_k, q5_k, q6_k: a float16 header per 256 weights and integer
 *   sub-scales per block (dot_layout.h), the scales d * sc and minimums -(dmin * m) formed
 *   from them as exact float32 products;
 * - codes: nibble formats (q4_0, q4_1, q4_k): chunk t (0..3) holds per row 4 bytes whose low
 *   nibbles are codes 4t..4t+3 and high nibbles codes 16+4t..16+4t+3; q8_0: chunk j (0..7)
 *   holds per row codes 4j..4j+3 as w + 128, one byte each; q5_0, q5_1, q5_k, q6_k: their low
 *   4 bits as the nibble formats', then their high bits in one or two chunks (dot_layout.h);
 * - offsets: q4_0 8, q5_0 16, q6_k 32, q8_0 and the lookup formats 128, tq1_0, tq2_0 and q1_0 1, else 0.
 * The lookup formats (iq4_nl, iq4_xs, mxfp4) read as w = scale * TABLE[code] instead:
 * lookup_values.h says what their records hold (nibble codes as q4_0's, read through the table).
 * q2_k and q3_k keep a header per 256 weights and their codes packed: dot_k_low.h.
 * tq1_0, tq2_0 and q1_0 keep one float16 scale per GGUF block: one record covers the blocks of
 * 32 of a GGUF block (dot_record.h: its 16 scales, then tq1_0's bytes of five trits as stored,
 * or 2-bit or 1-bit codes per block of 32), dot_record_bytes being its share per block of 32.
 * A last, partial group is padded with zero records. */
#define DOT_GROUP 16
#define DOT_CHUNK 64
/* The grouped weight layout interleaves the blocks of this many consecutive weight rows:
 * row n's block b sits at group base + (b * rows in the group + n % WEIGHT_GROUP) * block bytes. */
#define WEIGHT_GROUP 4
/* Attention reduces keys in tiles of this many absolute positions. */
#define KEY_TILE 64
/* Attention runs the rows of a (KV head, row block) item in runs of at most this many, which
 * take turns on each key tile. */
#define ATTENTION_ROW_BLOCK 8
/* Attention keeps per-head accumulators on the stack; this bounds the head dimension. */
#define MAX_HEAD_DIM 1024

/* The bytes of q1_0's lookup tables per quantized block and activation row. */
#define SIGN_TABLE_BYTES 256

/* Activation rows quantized per block of 32 for the dot layout: scale d = max |x| / 127 (0 for
 * a zero block), q = x / d rounded to nearest even and clamped to [-127, 127]. Block-major, so
 * that a tile of rows finds its block's values at fixed offsets. */
struct quantized_rows {
    int8_t *values;          /* [K / 32, M, 32] */
    float *scales;           /* [K / 32, M]: d */
    float *scaled_sums;      /* [K / 32, M]: d * (float)sum(q) */
    int32_t *sums;           /* [K / 32, M]: sum(q) */
    int32_t *starts;         /* [K / 32, M, 2]: the integer sums a block's dot starts from,
                              * which take the codes' offset out (set by the matmul); the
                              * second is q6_k's, for the block's weights 16..31, the first
                              * covers the rest */
    const uint8_t *sign_tables; /* [K / 32, M, SIGN_TABLE_BYTES]: q1_0's lookup tables
                                 * (dot_sign_lookup.h) where the level's kernels read them,
                                 * else NULL */
};

struct matmul_problem {
    const float *x;          /* [M, K] */
    const uint8_t *weight;   /* [N, row_bytes] (rows, grouped) or dot records */
    const float *bias;       /* [N] or NULL */
    float *out;              /* [M, N], rows out_stride apart */
    ptrdiff_t rows, depth, columns;  /* M, K, N */
    ptrdiff_t out_stride;    /* floats from one output row to the next (0: N) */
    size_t row_bytes;
    int format;
    int layout;              /* enum weight_layout; grouped and dot need depth % 32 == 0 */
    const struct quantized_rows *quantized; /* the dot layout's quantized x */
};

struct quantize_problem {
    const float *x;          /* [M, K] */
    const struct quantized_rows *out;
    ptrdiff_t rows, depth;
};

struct attention_problem {
    const float *q;          /* [M, Hq, D] */
    const float *keys;       /* [Hkv, capacity, D] */
    const float *values;     /* [Hkv, capacity, D] */
    const int64_t *positions;/* [M] */
    float *out;              /* [M, Hq, D] */
    ptrdiff_t rows, heads, kv_heads, capacity, head_dim, window;
    float scale;
    /* A token tree, or NULL: row r sees the key of logical position tree_base + d (d up to
     * its depth) in slot tree_base + tree_paths[r * rows + d], the slot of its ancestor at
     * depth d; keys before tree_base are in their own slots. [M, M] */
    const int32_t *tree_paths;
    ptrdiff_t tree_base;
    /* A sink logit per query head ([Hq], gpt-oss), or NULL: one more logit in each row's
     * softmax denominator, with no value. The online softmax starts from it (running max =
     * sink, running sum = exp(sink - sink) = 1) before the first key tile. */
    const float *sinks;
};

struct rows_problem {
    const float *x;          /* rms_norm: [M, K]; rope: [M, H, D]; silu/gelu_mul: [M, 2I] */
    const float *weight;     /* rms_norm weight [K]; rope cos [M, D/2] */
    const float *weight2;    /* rope sin [M, D/2] */
    float *out;
    ptrdiff_t rows, width, heads; /* width: K, D or I */
    float eps;
};

/* One SIMD level's kernels; each call covers a slice of the work and is thread safe. */
struct kernel_table {
    const char *name;
    ptrdiff_t column_tile;   /* matmul output columns computed together */
    void (*matmul_columns)(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end);
    /* Items [first, end) of (row, KV head): item i is row i / kv_heads, KV head i % kv_heads. */
    /* Items [first, end) of (KV head, row block) items: KV head i / row_blocks, block
     * i % row_blocks of row_blocks even blocks of the rows (attention_body.h). */
    void (*attention_groups)(const struct attention_problem *p, ptrdiff_t row_blocks,
                             ptrdiff_t first, ptrdiff_t end);
    void (*rms_norm_rows)(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end);
    void (*rope_rows)(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end);
    void (*silu_mul_rows)(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end);
    void (*gelu_mul_rows)(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end);
    /* The integer-dot path; NULL on a level that borrows another level's (identical) one.
     * dot_matmul_columns covers output columns [first, end), first a multiple of DOT_GROUP. */
    void (*quantize_rows)(const struct quantize_problem *p, ptrdiff_t first, ptrdiff_t end);
    void (*dot_matmul_columns)(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end);
    /* The level's dot primitives see q8_0 weights as w + q8_code_bias (128 where the product
     * needs an unsigned operand, else 0); q4 codes are the stored 0..15 everywhere. */
    int q8_code_bias;
    /* q1_0's lookup tables (dot_sign_lookup.h) of the first `count` quantized blocks of q, on
     * a level whose dot_matmul_columns reads q->sign_tables where set, for calls of at most
     * sign_lookup_rows rows; NULL elsewhere. Only for CPUs with AVX-512 VBMI (dispatch.c's
     * sign_tables_for checks). */
    void (*build_sign_tables)(const struct quantized_rows *q, size_t count, uint8_t *out);
    int sign_lookup_rows;
};

extern const struct kernel_table kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
#define HAVE_X86_LEVELS 1
extern const struct kernel_table kernels_avx2;
extern const struct kernel_table kernels_avx512;
extern const struct kernel_table kernels_avx512vnni;
/* The avx512vnni level with the integer-dot matmul on tiles (dot_tiles.h): its tile
 * operations computed in C (a level for tests only), and on AMX where the compiler has it. */
const struct kernel_table *kernels_amx_emulated(void);
#if !defined(EXACTDRAFT_EMULATE_X86) &&                                            \
    ((defined(__clang__) && __clang_major__ >= 12) ||                               \
     (defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11))
#define HAVE_AMX_LEVEL 1
const struct kernel_table *kernels_amx(void);
#endif
#if defined(__GNUC__) && !defined(__clang__)
/* The scalar level built with FMA instructions (level_scalar_fma.c), for CPUs that have them. */
#define HAVE_SCALAR_FMA_LEVEL 1
extern const struct kernel_table kernels_scalar_fma;
#endif
#endif
#if defined(__aarch64__)
#define HAVE_NEON_LEVEL 1
extern const struct kernel_table kernels_neon;
#endif

/* Exact IEEE half -> float conversion without any instruction set extension. */
static inline float half_bits_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0x1fu) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {
        /* Subnormal half: normalise the mantissa into a float exponent. */
        uint32_t shift = 0;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            shift++;
        }
        bits = sign | ((113u - shift) << 23) | ((mantissa & 0x3ffu) << 13);
    }
    float value;
    __builtin_memcpy(&value, &bits, sizeof value);
    return value;
}

#endif
