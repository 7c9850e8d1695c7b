/* The kernels compiled for AVX-512F/BW/VL with VNNI (and AVX2, FMA and F16C): the float kernels
 * of the avx512 level plus the integer-dot matmul on vpdpbusd.
 *
 * Invariant: see kernel_body.h and dot_body.h; this file only picks the instruction set.
 * dispatch.c calls these kernels only after checking at run time that the CPU supports them.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(EXACTDRAFT_EMULATE_X86)
/* SIMDe: plain x86-64 code */
#elif defined(__clang__)
#pragma clang attribute push(                                                        \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#define LEVEL_NAME "avx512vnni"
#define KERNEL_TABLE kernels_avx512vnni
#include "vec_avx512.h"
#include "dot_avx512vnni.h"
#include "kernel_body.h"

#if defined(__clang__) && !defined(EXACTDRAFT_EMULATE_X86)
#pragma clang attribute pop
#endif
#endif
