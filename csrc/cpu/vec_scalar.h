/* The canonical arithmetic in plain C: 16-lane float "vectors", for kernel_body.h on machines
 * without a SIMD level here, and the definition every SIMD level reproduces.
 *
 * Invariant (the canonical arithmetic of exactdraft's CPU kernels): a vector has 16 float32
 * lanes; every lane operation is one correctly rounded IEEE operation (vf_fma is a fused
 * multiply-add, fmaf, rounded once; the build turns off any other contraction); max(a, b) is
 * a > b ? a : b; and every horizontal reduction meets the lanes in one tree: lane i + lane i+8,
 * then i + i+4, then i + i+2, then lane 0 + lane 1. A SIMD level may use any registers, but
 * must give these bits.
 */
#include <math.h>
#include <string.h>

#define VW 16
#define TILE_ROWS 2
/* Vectors attention may fill with one head's accumulators, side by side. */
#define ATTENTION_REGISTERS 8
#define TILE_COLUMNS 2

/* GCC and Clang vector types: the same lanewise operations, but the compiler keeps vectors in
 * registers and runs lanes side by side (a struct of floats goes through the stack). Other
 * compilers, and test builds that define EXACTDRAFT_STRUCT_VECTORS, use the struct. */
#if defined(__GNUC__) && !defined(EXACTDRAFT_STRUCT_VECTORS)
#define SCALAR_VECTOR_TYPES 1
typedef float vf __attribute__((vector_size(VW * sizeof(float))));
#define LANE(v, i) (v)[i]
#else
#define SCALAR_VECTOR_TYPES 0
typedef struct { float lane[VW]; } vf;
#define LANE(v, i) (v).lane[i]
#endif

#define LANEWISE(expr) do { for (int i = 0; i < VW; i++) { LANE(r, i) = (expr); } } while (0)


static inline vf vf_zero(void) { vf r; LANEWISE(0.0f); return r; }
static inline vf vf_set1(float a) { vf r; LANEWISE(a); return r; }
static inline vf vf_load(const float *p) { vf r; memcpy(&r, p, sizeof r); return r; }
static inline void vf_store(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf vf_load_partial(const float *p, int n)
{
    vf r = vf_zero();
    memcpy(&r, p, (size_t)n * sizeof(float));
    return r;
}
static inline void vf_store_partial(float *p, vf v, int n)
{
    memcpy(p, &v, (size_t)n * sizeof(float));
}
static inline vf vf_add(vf a, vf b) { vf r; LANEWISE(LANE(a, i) + LANE(b, i)); return r; }
static inline vf vf_sub(vf a, vf b) { vf r; LANEWISE(LANE(a, i) - LANE(b, i)); return r; }
static inline vf vf_mul(vf a, vf b) { vf r; LANEWISE(LANE(a, i) * LANE(b, i)); return r; }
static inline vf vf_div(vf a, vf b) { vf r; LANEWISE(LANE(a, i) / LANE(b, i)); return r; }
static inline vf vf_fma(vf a, vf b, vf c)
{
    vf r;
#if defined(EXACTDRAFT_UNFUSED_SCALAR)
    /* Test builds only: a multiply and an add, each rounded, which the canonical arithmetic
     * forbids; tests/kernels/test_cpu_levels.py shows the level check catches it. */
    LANEWISE(LANE(a, i) * LANE(b, i) + LANE(c, i));
#else
    LANEWISE(fmaf(LANE(a, i), LANE(b, i), LANE(c, i)));
#endif
    return r;
}
static inline vf vf_max(vf a, vf b) { vf r; LANEWISE(LANE(a, i) > LANE(b, i) ? LANE(a, i) : LANE(b, i)); return r; }
static inline vf vf_min(vf a, vf b) { vf r; LANEWISE(LANE(a, i) < LANE(b, i) ? LANE(a, i) : LANE(b, i)); return r; }

static inline vf vf_abs(vf a) { vf r; LANEWISE(fabsf(LANE(a, i))); return r; }

/* Store the lanes, integral values in [-127, 127], as int8. */
static inline void vf_store_int8(int8_t *p, vf v)
{
    for (int i = 0; i < VW; i++) p[i] = (int8_t)(int)LANE(v, i);
}

static inline float vf_sum(vf v)
{
    float eight[8], four[4], two[2];
    for (int i = 0; i < 8; i++) eight[i] = LANE(v, i) + LANE(v, i + 8);
    for (int i = 0; i < 4; i++) four[i] = eight[i] + eight[i + 4];
    for (int i = 0; i < 2; i++) two[i] = four[i] + four[i + 2];
    return two[0] + two[1];
}

/* Lane k of the result is vf_sum(d[k]). */
static inline vf vf_sum_lanes(const vf d[VW])
{
    vf r;
    for (int k = 0; k < VW; k++) LANE(r, k) = vf_sum(d[k]);
    return r;
}

static inline float max_of(float a, float b) { return a > b ? a : b; }

/* The largest lane, met in the canonical tree. */
static inline float vf_max_all(vf v)
{
    float eight[8], four[4], two[2];
    for (int i = 0; i < 8; i++) eight[i] = max_of(LANE(v, i), LANE(v, i + 8));
    for (int i = 0; i < 4; i++) four[i] = max_of(eight[i], eight[i + 4]);
    for (int i = 0; i < 2; i++) two[i] = max_of(four[i], four[i + 2]);
    return max_of(two[0], two[1]);
}

static inline vf vf_select_greater(vf a, vf b, vf t, vf f)
{
    vf r;
    LANEWISE(LANE(a, i) > LANE(b, i) ? LANE(t, i) : LANE(f, i));
    return r;
}

static inline vf vf_select_nan(vf a, vf t, vf f)
{
    vf r;
    LANEWISE(LANE(a, i) != LANE(a, i) ? LANE(t, i) : LANE(f, i));
    return r;
}

static inline vf vf_pow2n(vf n)
{
    uint32_t bits[VW];
    for (int i = 0; i < VW; i++) bits[i] = (uint32_t)((int32_t)LANE(n, i) + 127) << 23;
    vf r;
    memcpy(&r, bits, sizeof r);
    return r;
}

static inline vf vf_round(vf a)
{
    /* Adding and subtracting 1.5 * 2^23 rounds |a| < 2^22 to the nearest integer, ties even. */
    const float shifter = 12582912.0f;
    vf r;
    LANEWISE((LANE(a, i) + shifter) - shifter);
    return r;
}

static inline vf vf_load_bf16(const uint16_t *p)
{
    uint32_t bits[VW];
    for (int i = 0; i < VW; i++) bits[i] = (uint32_t)p[i] << 16;
    vf r;
    memcpy(&r, bits, sizeof r);
    return r;
}

/* 32 GGUF q4 weights nibble * scale + bias (exact product, one rounding): element i is the
 * low nibble of byte i, element i + 16 the high nibble. */
static inline void vf_decode_q4(const uint8_t *packed, vf scale, vf bias, vf out[32 / VW])
{
    for (int i = 0; i < 16; i++) {
        float low = (float)(packed[i] & 0x0f), high = (float)(packed[i] >> 4);
        LANE(out[i / VW], i % VW) = fmaf(low, LANE(scale, 0), LANE(bias, 0));
        LANE(out[(i + 16) / VW], (i + 16) % VW) = fmaf(high, LANE(scale, 0), LANE(bias, 0));
    }
}

static inline void vf_decode_int8(const uint8_t *packed, vf out[32 / VW])
{
    for (int i = 0; i < 32; i++) LANE(out[i / VW], i % VW) = (float)(int8_t)packed[i];
}

static inline float half_to_float(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return half_bits_to_float(h);
}
