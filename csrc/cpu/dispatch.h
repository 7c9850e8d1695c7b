/* Choosing the SIMD level once per process and spreading kernel work over the thread pool.
 *
 * Invariant: one level serves every call until it is changed explicitly, and the work split
 * (by output columns for matmul, (row, KV head) items for attention, rows otherwise) only decides
 * which thread computes an element, never how. The dot layout's matmul quantizes every row once
 * per call, before any column is computed.
 */
#ifndef EXACTDRAFT_CPU_DISPATCH_H
#define EXACTDRAFT_CPU_DISPATCH_H

#include "kernels.h"

/* The levels this CPU can run, best first; returns how many were written (at most `capacity`). */
int supported_levels(const struct kernel_table **out, int capacity);
/* Levels only tests select (select_level accepts them, nothing chooses them by default):
 * amx_emulated where avx512vnni runs. Returns how many were written. */
int test_levels(const struct kernel_table **out, int capacity);
const struct kernel_table *active_level(void);
/* Make the named level active; returns 0, or -1 if this CPU cannot run it. */
int select_level(const char *name);

/* Probe the amx level again (amx_probe.h); an active amx level that is now refused gives way
 * to the best level left. Returns why the level is absent, or NULL. */
const char *probe_amx_level(int assume_cpu_support, int refuse_permission);

/* Returns 0, or -1 when the dot layout's scratch memory cannot be allocated. */
int run_matmul(const struct matmul_problem *p);
/* The dot layout's matmul of p on `level` (its quantization and integer-dot kernels), spread
 * over the thread pool or, with parallel 0, on the calling thread; returns as run_matmul. */
int dot_matmul_on(const struct kernel_table *level, const struct matmul_problem *p,
                  int parallel);
/* The start values of the dot layout's integer block sums (kernels.h, struct quantized_rows)
 * for `per_block` = rows * K / 32 quantized blocks of a matmul by `format` weights, on a level
 * whose q8_0 codes carry q8_code_bias. */
void set_dot_starts(int format, int q8_code_bias, const struct quantized_rows *q,
                    size_t per_block);
/* q1_0's lookup tables of the quantized rows q (per_block blocks) where the dot kernels `dot`
 * read them and the CPU has AVX-512 VBMI: set as q->sign_tables and returned, for the caller
 * to free; else (and when out of memory: the bytewise path gives the same bits) NULL. */
uint8_t *sign_tables_for(const struct kernel_table *dot, int format, struct quantized_rows *q,
                         size_t per_block);
/* Quantize activation rows as the dot layout's matmul does (exposed for tests). */
void run_quantize_rows(const struct quantize_problem *p);
void run_attention(const struct attention_problem *p);
/* The problems of one pass's sequences in one dispatch (-1 when out of memory). */
int run_attention_batch(const struct attention_problem *problems, int count);
void run_rms_norm(const struct rows_problem *p);
void run_rope(const struct rows_problem *p);
void run_silu_mul(const struct rows_problem *p);
void run_gelu_mul(const struct rows_problem *p);

#endif
