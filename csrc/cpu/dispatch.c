/* Choosing the SIMD level once per process and spreading kernel work over the thread pool.
 *
 * Invariant: one level serves every call until it is changed explicitly, and the work split
 * (by output columns for matmul, (KV head, row block) items for attention, rows otherwise) only
 * decides which thread computes an element, never how.
 */
#include "dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "amx_probe.h"
#include "lookup_values.h"
#include "thread_pool.h"

/* Below these amounts of work a call runs on the calling thread: waking workers costs more. */
#define PARALLEL_MIN_MACS 150000
#define PARALLEL_MIN_ELEMENTS 65536
#define ATTENTION_PARALLEL_MIN_MACS 32768
/* Matmul splits N into this many contiguous chunks per thread: few enough that each thread
 * streams long runs of weights (which the prefetchers follow), enough to even out the load. */
#define MATMUL_CHUNKS_PER_THREAD 4
/* q1_0's lookup (dot_sign_lookup.h) costs a table of 256 bytes per quantized block and
 * activation row, built before any column and read for every group of weight rows: it pays
 * for calls with at least this many output columns, with few rows (the bytewise path shares
 * each decoded code among the rows), and while the tables stay in a core's own cache. Two
 * rows keep the bytewise path: its two-row tile measured faster on weights read from memory
 * (benchmarks/matmul_ab.py --shape 4096x65536 --formats q1_0: 1.06-1.09x with the lookup). */
#define SIGN_LOOKUP_MIN_COLUMNS 128
#define SIGN_LOOKUP_MAX_TABLE_BYTES (256 * 1024)
/* With one row the lookup reads four groups of weight rows at a time (dot_sign_lookup.h). */
#define SIGN_LOOKUP_COLUMN_TILE (4 * DOT_GROUP)

#if defined(HAVE_X86_LEVELS) && defined(EXACTDRAFT_EMULATE_X86)
/* The emulated test build runs every level on any x86-64 CPU. */
static int x86_has(const char *feature)
{
    __builtin_cpu_init();
    /* The scalar level's FMA build runs real FMA instructions, emulated build or not. */
    if (!strcmp(feature, "fma"))
        return __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx");
    return 1;
}
#elif defined(HAVE_X86_LEVELS)
static int x86_has(const char *feature)
{
    __builtin_cpu_init();
    if (!strcmp(feature, "avx512")) return __builtin_cpu_supports("avx512f");
    if (!strcmp(feature, "avx512vnni"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    if (!strcmp(feature, "avx2"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!strcmp(feature, "fma"))
        return __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx");
    if (!strcmp(feature, "avx512vbmi")) return __builtin_cpu_supports("avx512vbmi");
    return 0;
}
#endif

int supported_levels(const struct kernel_table **out, int capacity)
{
    int count = 0;
#if defined(HAVE_AMX_LEVEL)
    if (count < capacity && !amx_unavailable_reason()) out[count++] = kernels_amx();
#endif
#if defined(HAVE_X86_LEVELS)
    if (count < capacity && x86_has("avx512vnni")) out[count++] = &kernels_avx512vnni;
    if (count < capacity && x86_has("avx512")) out[count++] = &kernels_avx512;
    if (count < capacity && x86_has("avx2")) out[count++] = &kernels_avx2;
#endif
#if defined(HAVE_NEON_LEVEL)
    if (count < capacity) out[count++] = &kernels_neon;
#endif
#if defined(HAVE_SCALAR_FMA_LEVEL)
    /* The same bits as kernels_scalar, faster where the CPU fuses multiply-adds itself. */
    if (count < capacity && x86_has("fma")) {
        out[count++] = &kernels_scalar_fma;
        return count;
    }
#endif
    if (count < capacity) out[count++] = &kernels_scalar;
    return count;
}

int test_levels(const struct kernel_table **out, int capacity)
{
    int count = 0;
#if defined(HAVE_X86_LEVELS)
    if (count < capacity && x86_has("avx512vnni")) out[count++] = kernels_amx_emulated();
#endif
    (void)out;
    (void)capacity;
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
    const struct kernel_table *levels[8];
    int count = supported_levels(levels, 8);
    count += test_levels(levels + count, 8 - count);
    for (int i = 0; i < count; i++) {
        if (!strcmp(levels[i]->name, name)) {
            active = levels[i];
            return 0;
        }
    }
    return -1;
}

const char *probe_amx_level(int assume_cpu_support, int refuse_permission)
{
    const char *why = amx_probe(assume_cpu_support, refuse_permission);
#if defined(HAVE_AMX_LEVEL)
    if (why && active == kernels_amx()) active = NULL; /* the best level left, when next asked */
#endif
    return why;
}

/* ---- matmul ---- */

/* The level whose integer-dot kernels serve `level`: its own, or (avx512 only, every CPU of
 * which has AVX2) the avx2 level's; all levels give the same bits on this path. */
static const struct kernel_table *dot_level(const struct kernel_table *level)
{
#if defined(HAVE_X86_LEVELS)
    if (!level->dot_matmul_columns) return &kernels_avx2;
#endif
    return level;
}

struct quantize_job {
    const struct quantize_problem *problem;
    const struct kernel_table *kernels;
    ptrdiff_t chunk;
};

static void quantize_item(void *context, ptrdiff_t item)
{
    const struct quantize_job *job = context;
    ptrdiff_t first = item * job->chunk, end = first + job->chunk;
    if (end > job->problem->rows) end = job->problem->rows;
    job->kernels->quantize_rows(job->problem, first, end);
}

void run_quantize_rows(const struct quantize_problem *p)
{
    const struct kernel_table *kernels = dot_level(active_level());
    if ((double)p->rows * (double)p->depth < PARALLEL_MIN_ELEMENTS || p->rows < 2) {
        kernels->quantize_rows(p, 0, p->rows);
        return;
    }
    ptrdiff_t pieces = 4 * (ptrdiff_t)pool_threads();
    ptrdiff_t chunk = (p->rows + pieces - 1) / pieces;
    struct quantize_job job = {p, kernels, chunk};
    pool_run(quantize_item, &job, (p->rows + chunk - 1) / chunk);
}

struct matmul_job {
    const struct matmul_problem *problem;
    void (*columns)(const struct matmul_problem *p, ptrdiff_t first, ptrdiff_t end);
    ptrdiff_t chunk;
};

static void matmul_item(void *context, ptrdiff_t item)
{
    const struct matmul_job *job = context;
    ptrdiff_t first = item * job->chunk, end = first + job->chunk;
    if (end > job->problem->columns) end = job->problem->columns;
    job->columns(job->problem, first, end);
}

/* Columns in chunks of whole tiles, MATMUL_CHUNKS_PER_THREAD per thread. Every column is
 * computed on its own, so the chunking decides only which thread computes it. */
static void run_columns(const struct matmul_problem *p, ptrdiff_t tile,
                        void (*columns)(const struct matmul_problem *, ptrdiff_t, ptrdiff_t))
{
    double macs = (double)p->rows * (double)p->columns * (double)p->depth;
    if (macs < PARALLEL_MIN_MACS) {
        columns(p, 0, p->columns);
        return;
    }
    ptrdiff_t tiles = (p->columns + tile - 1) / tile;
    ptrdiff_t chunks = MATMUL_CHUNKS_PER_THREAD * (ptrdiff_t)pool_threads();
    ptrdiff_t chunk = tile * ((tiles + chunks - 1) / chunks);
    struct matmul_job job = {p, columns, chunk};
    pool_run(matmul_item, &job, (p->columns + chunk - 1) / chunk);
}

void set_dot_starts(int format, int q8_code_bias, const struct quantized_rows *q,
                    size_t per_block)
{
    /* The codes' offset, taken out of every block's integer sums exactly. */
    const int32_t offset = format == FORMAT_Q4_0   ? 8
                           : format == FORMAT_Q5_0 ? 16
                           : format == FORMAT_Q6_K ? 32
                           : format == FORMAT_Q8_0 || LOOKUP_CODES(format) ? q8_code_bias
                           : format == FORMAT_Q3_K ? 4
                           : format == FORMAT_Q2_K ? -1 /* the halves' sums themselves */
                           : format == FORMAT_TQ1_0 || format == FORMAT_TQ2_0 ||
                                   format == FORMAT_Q1_0
                               ? 1
                               : 0;
    int32_t *starts = q->starts;
    if (format == FORMAT_Q6_K || format == FORMAT_Q3_K || format == FORMAT_Q2_K) {
        /* Two scales cover weights 0..15 and 16..31: each half takes its own offset (q2_k's
         * codes have none: its starts are the halves' activation sums, which its minimums
         * multiply; dot_k_low.h). */
        for (size_t i = 0; i < per_block; i++) {
            const int8_t *values = q->values + i * QUANT_BLOCK;
            int32_t low = 0;
            for (int k = 0; k < QUANT_BLOCK / 2; k++) low += values[k];
            starts[2 * i] = -offset * low;
            starts[2 * i + 1] = -offset * (q->sums[i] - low);
        }
        return;
    }
    for (size_t i = 0; i < per_block; i++) {
        starts[2 * i] = -offset * q->sums[i];
        starts[2 * i + 1] = 0;
    }
}

uint8_t *sign_tables_for(const struct kernel_table *dot, int format, struct quantized_rows *q,
                         size_t per_block)
{
    q->sign_tables = NULL;
#if defined(HAVE_X86_LEVELS)
    if (format != FORMAT_Q1_0 || !dot->build_sign_tables || !x86_has("avx512vbmi")) return NULL;
    /* On cache lines, so that each 64-byte table vector is one line's read. */
    uint8_t *tables = aligned_alloc(64, per_block * SIGN_TABLE_BYTES);
    if (!tables) return NULL; /* the bytewise path gives the same bits */
    dot->build_sign_tables(q, per_block, tables);
    q->sign_tables = tables;
    return tables;
#else
    (void)dot, (void)format, (void)per_block;
    return NULL;
#endif
}

int dot_matmul_on(const struct kernel_table *level, const struct matmul_problem *p,
                  int parallel)
{
    const struct kernel_table *kernels = dot_level(level);
    const size_t per_block = (size_t)p->rows * (size_t)(p->depth / QUANT_BLOCK);
    const size_t values = per_block * QUANT_BLOCK;
    char *scratch = malloc(values + 5 * per_block * sizeof(float));
    if (!scratch) return -1;
    /* values is a multiple of 32 bytes, so the arrays after it are aligned for floats. */
    float *floats = (float *)(scratch + values);
    struct quantized_rows quantized = {
        .values = (int8_t *)scratch, .scales = floats, .scaled_sums = floats + per_block,
        .sums = (int32_t *)(floats + 2 * per_block), .starts = (int32_t *)(floats + 3 * per_block),
    };
    struct quantize_problem quantize = {p->x, &quantized, p->rows, p->depth};
    if (parallel) run_quantize_rows(&quantize);
    else kernels->quantize_rows(&quantize, 0, p->rows);
    set_dot_starts(p->format, kernels->q8_code_bias, &quantized, per_block);
    uint8_t *tables = p->rows >= 1 && p->rows <= kernels->sign_lookup_rows && p->rows != 2 &&
                              p->columns >= SIGN_LOOKUP_MIN_COLUMNS &&
                              per_block * SIGN_TABLE_BYTES <= SIGN_LOOKUP_MAX_TABLE_BYTES
                          ? sign_tables_for(kernels, p->format, &quantized, per_block)
                          : NULL;
    struct matmul_problem with_rows = *p;
    with_rows.quantized = &quantized;
    const ptrdiff_t tile = tables && p->rows == 1 ? SIGN_LOOKUP_COLUMN_TILE : DOT_GROUP;
    if (parallel) run_columns(&with_rows, tile, kernels->dot_matmul_columns);
    else kernels->dot_matmul_columns(&with_rows, 0, p->columns);
    free(tables);
    free(scratch);
    return 0;
}

int run_matmul(const struct matmul_problem *p)
{
    if (p->layout == LAYOUT_DOT) return dot_matmul_on(active_level(), p, 1);
    const struct kernel_table *kernels = active_level();
    run_columns(p, kernels->column_tile, kernels->matmul_columns);
    return 0;
}

/* ---- attention ---- */

/* Row blocks per KV head for attention: as few as runs of ATTENTION_ROW_BLOCK rows allow, so
 * that a block's rows share each key tile, but at least two items per thread where there are
 * rows enough. */
static ptrdiff_t attention_row_blocks(const struct attention_problem *p, int threads)
{
    const ptrdiff_t runs = (p->rows + ATTENTION_ROW_BLOCK - 1) / ATTENTION_ROW_BLOCK;
    ptrdiff_t wanted = (2 * (ptrdiff_t)threads + p->kv_heads - 1) / p->kv_heads;
    if (wanted > p->rows) wanted = p->rows;
    return runs > wanted ? runs : wanted;
}

/* The (KV head, row block) items of several problems (the sequences of one pass) in one
 * dispatch: item i of the batch is item i - first[j] of problem j, first[j] counting the items
 * before it. */
struct attention_job {
    const struct attention_problem *problems;
    const ptrdiff_t *first; /* [count + 1] */
    int count;
    const struct kernel_table *kernels;
};

static void attention_item(void *context, ptrdiff_t item)
{
    const struct attention_job *job = context;
    int j = 0;
    while (item >= job->first[j + 1]) j++;
    const ptrdiff_t local = item - job->first[j];
    const ptrdiff_t row_blocks = (job->first[j + 1] - job->first[j]) / job->problems[j].kv_heads;
    job->kernels->attention_groups(&job->problems[j], row_blocks, local, local + 1);
}

int run_attention_batch(const struct attention_problem *problems, int count)
{
    const struct kernel_table *kernels = active_level();
    enum { ON_STACK = 16 }; /* sequences whose item offsets need no allocation */
    ptrdiff_t first_items[ON_STACK + 1];
    ptrdiff_t *first = count <= ON_STACK ? first_items
                                         : malloc(sizeof(ptrdiff_t) * (size_t)(count + 1));
    if (!first) return -1;
    double work = 0;
    const int threads = pool_threads();
    first[0] = 0;
    for (int j = 0; j < count; j++) {
        const struct attention_problem *p = &problems[j];
        double keys = 0;
        for (ptrdiff_t m = 0; m < p->rows; m++) keys += (double)(p->positions[m] + 1);
        work += keys * (double)p->heads * (double)p->head_dim;
        first[j + 1] = first[j] + attention_row_blocks(p, threads) * p->kv_heads;
    }
    if (work < ATTENTION_PARALLEL_MIN_MACS || first[count] < 2) {
        for (int j = 0; j < count; j++) {
            const ptrdiff_t items = first[j + 1] - first[j];
            kernels->attention_groups(&problems[j], items / problems[j].kv_heads, 0, items);
        }
    } else {
        struct attention_job job = {problems, first, count, kernels};
        pool_run(attention_item, &job, first[count]);
    }
    if (first != first_items) free(first);
    return 0;
}

void run_attention(const struct attention_problem *p) { run_attention_batch(p, 1); }

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

void run_gelu_mul(const struct rows_problem *p)
{
    run_rows(p, p->width, active_level()->gelu_mul_rows);
}
