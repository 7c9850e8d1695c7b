/* Choosing the SIMD level once per process and spreading kernel work over the thread pool.
 *
 * Invariant: one level serves every call until it is changed explicitly, and the work split
 * (by output columns for matmul, (row, head) pairs for attention, rows otherwise) only decides
 * which thread computes an element, never how. Matmul column chunks are a function of N alone.
 */
#include "dispatch.h"

#include <string.h>

#include "thread_pool.h"

/* Below these amounts of work a call runs on the calling thread: waking workers costs more. */
#define PARALLEL_MIN_MACS 150000
#define PARALLEL_MIN_ELEMENTS 65536
/* Matmul splits N into at most this many chunks. */
#define MATMUL_MAX_CHUNKS 64

#if defined(HAVE_X86_LEVELS)
static int x86_has(const char *feature)
{
    __builtin_cpu_init();
    if (!strcmp(feature, "avx512")) return __builtin_cpu_supports("avx512f");
    if (!strcmp(feature, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return 0;
}
#endif

int supported_levels(const struct kernel_table **out, int capacity)
{
    int count = 0;
#if defined(HAVE_X86_LEVELS)
    if (count < capacity && x86_has("avx512")) out[count++] = &kernels_avx512;
    if (count < capacity && x86_has("avx2")) out[count++] = &kernels_avx2;
#endif
#if defined(HAVE_NEON_LEVEL)
    if (count < capacity) out[count++] = &kernels_neon;
#endif
    if (count < capacity) out[count++] = &kernels_scalar;
    return count;
}

static const struct kernel_table *active;

const struct kernel_table *active_level(void)
{
    if (!active) {
        const struct kernel_table *best[1];
        supported_levels(best, 1);
        active = best[0];
    }
    return active;
}

int select_level(const char *name)
{
    const struct kernel_table *levels[4];
    int count = supported_levels(levels, 4);
    for (int i = 0; i < count; i++) {
        if (!strcmp(levels[i]->name, name)) {
            active = levels[i];
            return 0;
        }
    }
    return -1;
}

/* ---- matmul ---- */

struct matmul_job {
    const struct matmul_problem *problem;
    const struct kernel_table *kernels;
    ptrdiff_t chunk;
};

static void matmul_item(void *context, ptrdiff_t item)
{
    const struct matmul_job *job = context;
    ptrdiff_t first = item * job->chunk, end = first + job->chunk;
    if (end > job->problem->columns) end = job->problem->columns;
    job->kernels->matmul_columns(job->problem, first, end);
}

void run_matmul(const struct matmul_problem *p)
{
    const struct kernel_table *kernels = active_level();
    double macs = (double)p->rows * (double)p->columns * (double)p->depth;
    if (macs < PARALLEL_MIN_MACS) {
        kernels->matmul_columns(p, 0, p->columns);
        return;
    }
    ptrdiff_t tile = kernels->column_tile;
    ptrdiff_t tiles = (p->columns + tile - 1) / tile;
    ptrdiff_t chunk = tile * ((tiles + MATMUL_MAX_CHUNKS - 1) / MATMUL_MAX_CHUNKS);
    struct matmul_job job = {p, kernels, chunk};
    pool_run(matmul_item, &job, (p->columns + chunk - 1) / chunk);
}

/* ---- attention ---- */

struct attention_job {
    const struct attention_problem *problem;
    const struct kernel_table *kernels;
};

static void attention_item(void *context, ptrdiff_t item)
{
    const struct attention_job *job = context;
    job->kernels->attention_pairs(job->problem, item, item + 1);
}

void run_attention(const struct attention_problem *p)
{
    const struct kernel_table *kernels = active_level();
    double work = 0;
    for (ptrdiff_t m = 0; m < p->rows; m++) work += (double)(p->positions[m] + 1);
    work *= (double)p->heads * (double)p->head_dim;
    ptrdiff_t pairs = p->rows * p->heads;
    if (work < PARALLEL_MIN_MACS) {
        kernels->attention_pairs(p, 0, pairs);
        return;
    }
    struct attention_job job = {p, kernels};
    pool_run(attention_item, &job, pairs);
}

/* ---- row-wise ops ---- */

struct rows_job {
    const struct rows_problem *problem;
    void (*rows)(const struct rows_problem *p, ptrdiff_t first, ptrdiff_t end);
    ptrdiff_t chunk;
};

static void rows_item(void *context, ptrdiff_t item)
{
    const struct rows_job *job = context;
    ptrdiff_t first = item * job->chunk, end = first + job->chunk;
    if (end > job->problem->rows) end = job->problem->rows;
    job->rows(job->problem, first, end);
}

static void run_rows(const struct rows_problem *p, ptrdiff_t elements_per_row,
                     void (*rows)(const struct rows_problem *, ptrdiff_t, ptrdiff_t))
{
    if ((double)p->rows * (double)elements_per_row < PARALLEL_MIN_ELEMENTS || p->rows < 2) {
        rows(p, 0, p->rows);
        return;
    }
    ptrdiff_t pieces = 4 * (ptrdiff_t)pool_threads();
    ptrdiff_t chunk = (p->rows + pieces - 1) / pieces;
    struct rows_job job = {p, rows, chunk};
    pool_run(rows_item, &job, (p->rows + chunk - 1) / chunk);
}

void run_rms_norm(const struct rows_problem *p)
{
    run_rows(p, p->width, active_level()->rms_norm_rows);
}

void run_rope(const struct rows_problem *p)
{
    run_rows(p, p->width * p->heads, active_level()->rope_rows);
}

void run_silu_mul(const struct rows_problem *p)
{
    run_rows(p, p->width, active_level()->silu_mul_rows);
}
