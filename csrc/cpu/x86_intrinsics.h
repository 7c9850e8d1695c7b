/* The x86 intrinsics the AVX2 and AVX-512 levels are written in: the compiler's own, or, when
 * EXACTDRAFT_EMULATE_X86 is defined, SIMDe's portable implementations of the same functions
 * (tests build the levels that way to run them on CPUs that lack the instructions).
 *
 * Invariant: both give each intrinsic its documented IEEE and integer semantics, so a level
 * built either way computes the same bits; the emulated build exists only for tests.
 */
#ifndef EXACTDRAFT_CPU_X86_INTRINSICS_H
#define EXACTDRAFT_CPU_X86_INTRINSICS_H

#if defined(EXACTDRAFT_EMULATE_X86)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/fma.h>
#include <math.h>
#include <string.h>

#include "kernels.h"

/* Intrinsics this SIMDe release lacks, lane by lane as Intel documents them. */
#define __mmask16 simde__mmask16
#define __mmask32 simde__mmask32
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC SIMDE_MM_FROUND_NO_EXC
#define _MM_FROUND_TO_NEAREST_INT SIMDE_MM_FROUND_TO_NEAREST_INT
#endif
#define LANES_OF(type, count, value) type value##_lanes[count]; memcpy(value##_lanes, &value, sizeof value)
#define FROM_LANES(vtype, value) vtype value; memcpy(&value, value##_lanes, sizeof value)

static inline float emulated_cvtsh_ss(unsigned short h) { return half_bits_to_float(h); }

static inline simde__m512 emulated_mm512_cvtph_ps(simde__m256i a)
{
    LANES_OF(uint16_t, 16, a);
    float r_lanes[16];
    for (int i = 0; i < 16; i++) r_lanes[i] = half_bits_to_float(a_lanes[i]);
    FROM_LANES(simde__m512, r);
    return r;
}

static inline simde__m512 emulated_mm512_cvtepi32_ps(simde__m512i a)
{
    LANES_OF(int32_t, 16, a);
    float r_lanes[16];
    for (int i = 0; i < 16; i++) r_lanes[i] = (float)a_lanes[i];
    FROM_LANES(simde__m512, r);
    return r;
}

/* Round to nearest, ties to even (the default MXCSR mode). */
static inline simde__m512i emulated_mm512_cvtps_epi32(simde__m512 a)
{
    LANES_OF(float, 16, a);
    int32_t r_lanes[16];
    for (int i = 0; i < 16; i++) r_lanes[i] = (int32_t)nearbyintf(a_lanes[i]);
    FROM_LANES(simde__m512i, r);
    return r;
}

static inline simde__m128i emulated_mm512_cvtepi32_epi8(simde__m512i a)
{
    LANES_OF(int32_t, 16, a);
    int8_t r_lanes[16];
    for (int i = 0; i < 16; i++) r_lanes[i] = (int8_t)a_lanes[i];
    FROM_LANES(simde__m128i, r);
    return r;
}

#define WIDEN(name, from_type, from_vector)                              \
    static inline simde__m512i emulated_##name(from_vector a)           \
    {                                                                    \
        LANES_OF(from_type, 16, a);                                      \
        int32_t r_lanes[16];                                             \
        for (int i = 0; i < 16; i++) r_lanes[i] = (int32_t)a_lanes[i];   \
        FROM_LANES(simde__m512i, r);                                     \
        return r;                                                        \
    }
WIDEN(mm512_cvtepi8_epi32, int8_t, simde__m128i)
WIDEN(mm512_cvtepu8_epi32, uint8_t, simde__m128i)
WIDEN(mm512_cvtepu16_epi32, uint16_t, simde__m256i)

static inline simde__m512 emulated_mm512_maskz_loadu_ps(simde__mmask16 mask, const void *p)
{
    float r_lanes[16];
    for (int i = 0; i < 16; i++) r_lanes[i] = (mask >> i) & 1 ? ((const float *)p)[i] : 0.0f;
    FROM_LANES(simde__m512, r);
    return r;
}

static inline void emulated_mm512_mask_storeu_ps(void *p, simde__mmask16 mask, simde__m512 a)
{
    LANES_OF(float, 16, a);
    for (int i = 0; i < 16; i++)
        if ((mask >> i) & 1) ((float *)p)[i] = a_lanes[i];
}

/* 128-bit lanes a[imm & 3], a[imm >> 2 & 3], b[imm >> 4 & 3], b[imm >> 6 & 3]. */
static inline simde__m512 emulated_mm512_shuffle_f32x4(simde__m512 a, simde__m512 b, int imm)
{
    LANES_OF(float, 16, a);
    LANES_OF(float, 16, b);
    float r_lanes[16];
    for (int part = 0; part < 4; part++) {
        const float *from = part < 2 ? a_lanes : b_lanes;
        memcpy(r_lanes + 4 * part, from + 4 * ((imm >> (2 * part)) & 3), 4 * sizeof(float));
    }
    FROM_LANES(simde__m512, r);
    return r;
}

/* SIMDe's portable fused multiply-adds round twice; the instruction rounds once. */
#define FUSED(name, vector, count)                                                   \
    static inline vector emulated_##name(vector a, vector b, vector c)               \
    {                                                                                \
        LANES_OF(float, count, a);                                                   \
        LANES_OF(float, count, b);                                                   \
        LANES_OF(float, count, c);                                                   \
        float r_lanes[count];                                                        \
        for (int i = 0; i < count; i++) r_lanes[i] = fmaf(a_lanes[i], b_lanes[i], c_lanes[i]); \
        FROM_LANES(vector, r);                                                       \
        return r;                                                                    \
    }
FUSED(mm_fmadd_ps, simde__m128, 4)
FUSED(mm256_fmadd_ps, simde__m256, 8)
FUSED(mm512_fmadd_ps, simde__m512, 16)

#undef _mm_fmadd_ps
#undef _mm256_fmadd_ps
#undef _mm512_fmadd_ps
#define _mm_fmadd_ps emulated_mm_fmadd_ps
#define _mm256_fmadd_ps emulated_mm256_fmadd_ps
#define _mm512_fmadd_ps emulated_mm512_fmadd_ps
#undef _cvtsh_ss
#define _cvtsh_ss emulated_cvtsh_ss
#define _mm512_cvtph_ps emulated_mm512_cvtph_ps
#define _mm512_cvtepi32_ps emulated_mm512_cvtepi32_ps
#define _mm512_cvtps_epi32 emulated_mm512_cvtps_epi32
#define _mm512_cvtepi32_epi8 emulated_mm512_cvtepi32_epi8
#define _mm512_cvtepi8_epi32 emulated_mm512_cvtepi8_epi32
#define _mm512_cvtepu8_epi32 emulated_mm512_cvtepu8_epi32
#define _mm512_cvtepu16_epi32 emulated_mm512_cvtepu16_epi32
#define _mm512_maskz_loadu_ps emulated_mm512_maskz_loadu_ps
#define _mm512_mask_storeu_ps emulated_mm512_mask_storeu_ps
#define _mm512_shuffle_f32x4 emulated_mm512_shuffle_f32x4
#else
#include <immintrin.h>
#endif

#endif
