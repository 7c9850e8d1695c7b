/* Shared declarations of the row-invariant CPU kernels.
 *
 * Invariant: every output element is computed by one fixed sequence of IEEE operations chosen
 * by the problem's shape along the reduced dimension (K for matmul, D and the row's own position
 * for attention) and the SIMD level picked once per process. Row count, a row's place in the
 * pass, tiling, work partition and thread count change which core runs an element and in what
 * order elements are visited, never the arithmetic of one element.
 */
#ifndef EXACTDRAFT_CPU_KERNELS_H
#define EXACTDRAFT_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum weight_format { FORMAT_F32 = 0, FORMAT_BF16 = 1, FORMAT_Q8_0 = 2, FORMAT_Q4_0 = 3,
                     FORMAT_Q4_1 = 4, FORMAT_COUNT = 5 };

/* Quantized formats hold blocks of 32 weights along K. */
#define QUANT_BLOCK 32
/* The grouped weight layout interleaves the blocks of this many consecutive weight rows:
 * row n's block b sits at group base + (b * rows in the group + n % WEIGHT_GROUP) * block bytes. */
#define WEIGHT_GROUP 4
/* Attention reduces keys in tiles of this many absolute positions. */
#define KEY_TILE 64
/* Attention keeps per-head accumulators on the stack; this bounds the head dimension. */
#define MAX_HEAD_DIM 1024

struct matmul_problem {
    const float *x;          /* [M, K] */
    const uint8_t *weight;   /* [N, row_bytes] */
    const float *bias;       /* [N] or NULL */
    float *out;              /* [M, N] */
    ptrdiff_t rows, depth, columns;  /* M, K, N */
    size_t row_bytes;
    int format;
    int grouped;             /* 1: the grouped layout (depth % 32 == 0); 0: plain rows */
};

struct attention_problem {
    const float *q;          /* [M, Hq, D] */
    const float *keys;       /* [Hkv, capacity, D] */
    const float *values;     /* [Hkv, capacity, D] */
    const int64_t *positions;/* [M] */
    float *out;              /* [M, Hq, D] */
    ptrdiff_t rows, heads, kv_heads, capacity, head_dim, window;
    float scale;
};

struct rows_problem {
    const float *x;          /* rms_norm: [M, K]; rope: [M, H, D]; silu_mul: [M, 2I] */
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
    void (*attention_pairs)(const struct attention_problem *p, ptrdiff_t first, ptrdiff_t end);
    void (*rms_norm_rows)(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end);
    void (*rope_rows)(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end);
    void (*silu_mul_rows)(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end);
};

extern const struct kernel_table kernels_scalar;
#if defined(__x86_64__) || defined(_M_X64)
#define HAVE_X86_LEVELS 1
extern const struct kernel_table kernels_avx2;
extern const struct kernel_table kernels_avx512;
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
