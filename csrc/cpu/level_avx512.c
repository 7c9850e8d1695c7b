/* The kernels compiled for AVX-512F (with AVX2, FMA and F16C, which every AVX-512F CPU has).
 *
 * Invariant: see kernel_body.h; this file only picks the instruction set. dispatch.c calls these
 * kernels only after checking at run time that the CPU supports them. This level has no integer
 * primitives of its own (512-bit byte arithmetic needs AVX-512BW): the dispatcher gives it the
 * avx2 level's integer-dot matmul, whose bits every level shares.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(EXACTDRAFT_EMULATE_X86)
/* SIMDe: plain x86-64 code */
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#define LEVEL_NAME "avx512"
#define KERNEL_TABLE kernels_avx512
#include "vec_avx512.h"
#include "kernel_body.h"

#if defined(__clang__) && !defined(EXACTDRAFT_EMULATE_X86)
#pragma clang attribute pop
#endif
#endif
