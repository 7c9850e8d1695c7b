/* The kernels in portable C, for CPUs without a SIMD level here (and to test that path).
 *
 * Invariant: see kernel_body.h; this file only picks the instruction set.
 */
#include <stdint.h>

#include "kernels.h"

#define LEVEL_NAME "scalar"
#define KERNEL_TABLE kernels_scalar
#include "vec_scalar.h"
#include "dot_scalar.h"
#include "kernel_body.h"
