/* The kernels compiled for arm64 NEON, which every arm64 CPU has.
 *
 * Invariant: see kernel_body.h; this file only picks the instruction set.
 */
#if defined(__aarch64__)
#define LEVEL_NAME "neon"
#define KERNEL_TABLE kernels_neon
#include "vec_neon.h"
#include "dot_neon.h"
#include "kernel_body.h"
#endif
