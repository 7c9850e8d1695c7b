/* The portable C kernels again, compiled for x86-64 CPUs that have FMA, served as the scalar
 * level there (they all have AVX): each fmaf becomes one instruction instead of a call into
 * libm's software path, and the compiler may run lanes side by side in AVX registers.
 *
 * Invariant: the same source and the same bits as level_scalar.c (fmaf is one correctly rounded
 * operation either way); only the instructions differ. check_levels.c compares the two.
 */
#include <stdint.h>

#include "kernels.h"

#if defined(HAVE_SCALAR_FMA_LEVEL)
#pragma GCC target("avx,fma")
#define LEVEL_NAME "scalar"
#define KERNEL_TABLE kernels_scalar_fma
#include "vec_scalar.h"
#include "dot_scalar.h"
#include "kernel_body.h"
#endif
