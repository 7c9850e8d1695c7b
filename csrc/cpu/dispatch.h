/* Choosing the SIMD level once per process and spreading kernel work over the thread pool.
 *
 * Invariant: one level serves every call until it is changed explicitly, and the work split
 * (by output columns for matmul, (row, head) pairs for attention, rows otherwise) only decides
 * which thread computes an element, never how.
 */
#ifndef EXACTDRAFT_CPU_DISPATCH_H
#define EXACTDRAFT_CPU_DISPATCH_H

#include "kernels.h"

/* The levels this CPU can run, best first; returns how many were written (at most `capacity`). */
int supported_levels(const struct kernel_table **out, int capacity);
const struct kernel_table *active_level(void);
/* Make the named level active; returns 0, or -1 if this CPU cannot run it. */
int select_level(const char *name);

void run_matmul(const struct matmul_problem *p);
void run_attention(const struct attention_problem *p);
void run_rms_norm(const struct rows_problem *p);
void run_rope(const struct rows_problem *p);
void run_silu_mul(const struct rows_problem *p);

#endif
