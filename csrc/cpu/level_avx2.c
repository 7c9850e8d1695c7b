/* The kernels compiled for AVX2 with FMA and F16C.
 *
 * Invariant: see kernel_body.h; this file only picks the instruction set. dispatch.c calls these
 * kernels only after checking at run time that the CPU supports them.
 */
#if defined(__x86_64__) || defined(_M_X64)
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(EXACTDRAFT_EMULATE_X86)
/* SIMDe: plain x86-64 code */
#elif defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#define LEVEL_NAME "avx2"
#define KERNEL_TABLE kernels_avx2
#include "vec_avx2.h"
#include "dot_avx2.h"
#include "kernel_body.h"

#if defined(__clang__) && !defined(EXACTDRAFT_EMULATE_X86)
#pragma clang attribute pop
#endif
#endif
