/* Causal grouped-query attention, written against the vf primitives of a level; included by
 * kernel_body.h.
 *
 * Invariant: keys are cut into KEY_TILE tiles aligned to absolute positions; a tile holds only
 * the row's visible keys, tiles are merged by an online softmax in position order, so nothing
 * past the row's own position (cache capacity, other rows) is ever read. Every (row, head) runs
 * one fixed sequence of float operations. In a token tree a row reads its ancestors' keys as the
 * keys of the positions they stand for (key_slot), so it runs the operations of a serial step
 * over its own path. The query heads that share a KV head are computed
 * side by side, so that each key and value is loaded once for all of them, and the rows of a
 * block take turns on each key tile, so that its keys and values are read from memory once for
 * the block: that changes which head's or row's operation comes next, never the operations of
 * any (row, head).
 *
 * Sinks (attention_problem.sinks): a head's sink joins the row's softmax as one more logit
 * with no value, at a fixed place of the order: the running max and sum start from it (max =
 * sink, sum = 1) instead of (-inf, 0), so the first tile rescales it as it rescales any earlier
 * tile, and the rest of the order is the one without sinks.
 */

#define MAX_HEAD_VECTORS (MAX_HEAD_DIM / VW + 1)
/* Keys of the VW-key loop unrolled: a level sets fewer where that measured faster (AVX2). */
#ifndef ATTENTION_KEY_UNROLL
#define ATTENTION_KEY_UNROLL 16
#endif
/* Two steps, so that the count is expanded before it is quoted. */
#define UNROLL_PRAGMA(text) _Pragma(#text)
#define UNROLL_BY(n) UNROLL_PRAGMA(GCC unroll n)
/* The most query heads computed side by side. */
#define MAX_SIDE_BY_SIDE 4

/* Heads side by side for a head dimension: as many as keep their accumulators in registers. */
static ptrdiff_t heads_side_by_side(ptrdiff_t head_dim)
{
    const ptrdiff_t vectors = (head_dim + VW - 1) / VW;
    const ptrdiff_t side = ATTENTION_REGISTERS / vectors;
    return side < 1 ? 1 : side > MAX_SIDE_BY_SIDE ? MAX_SIDE_BY_SIDE : side;
}

/* Lane-wise partial sums of q . key (vf_sum finishes the dot product). */
static ALWAYS_INLINE vf key_dot(const vf *q, const float *key, const ptrdiff_t vectors,
                                const int tail)
{
    vf dot = vf_zero();
    for (ptrdiff_t v = 0; v < vectors; v++) dot = vf_fma(q[v], vf_load(key + v * VW), dot);
    if (tail) dot = vf_fma(q[vectors], vf_load_partial(key + vectors * VW, tail), dot);
    return dot;
}

/* One query head's `vectors` full vectors and `tail` lanes. */
static ALWAYS_INLINE void load_query(const float *query, const ptrdiff_t vectors, const int tail,
                                     vf *q)
{
    for (ptrdiff_t v = 0; v < vectors; v++) q[v] = vf_load(query + v * VW);
    if (tail) q[vectors] = vf_load_partial(query + vectors * VW, tail);
}

/* The buffer slot of the key at logical position j for `row`: its own slot, except past the
 * tree base of a token tree, where the row's path says which row's key stands there. `in_order`
 * says that the caller knows j is in its own slot (no tree, or j before the tree base), so that
 * the hot loops address keys without a branch. */
static ALWAYS_INLINE ptrdiff_t key_slot(const struct attention_problem *p, ptrdiff_t row,
                                        ptrdiff_t j, const int in_order)
{
    if (in_order || !p->tree_paths || j < p->tree_base) return j;
    return p->tree_base + p->tree_paths[row * p->rows + (j - p->tree_base)];
}

/* One key tile [start, start + KEY_TILE) of one row's query heads head0 .. head0 + count - 1,
 * which share a KV head, keys lo..hi of it visible to the row (`in_order`: all in their own
 * slots, key_slot). The row's value accumulators (`acc_state`, [count, all]) and running maxima
 * and sums live in memory between tiles, so that the rows of a block can take turns on a tile
 * while its keys and values are in L1; loading and storing them changes no bits. `vectors`
 * full vectors plus `tail` lanes make up the head dimension; the instances below fix them at
 * compile time for common head sizes. */
static ALWAYS_INLINE void attention_tile(const struct attention_problem *p, ptrdiff_t row,
                                         ptrdiff_t head0, const int count,
                                         const ptrdiff_t vectors, const int tail,
                                         const ptrdiff_t start, const ptrdiff_t lo,
                                         const ptrdiff_t hi, const float *keys,
                                         const float *values, vf *acc_state,
                                         float *running_max, float *running_sum,
                                         const int in_order)
{
    const ptrdiff_t dim = p->head_dim;
    const ptrdiff_t all = vectors + (tail ? 1 : 0);
    const float *query = p->q + (row * p->heads + head0) * dim;
    float scores[MAX_SIDE_BY_SIDE][KEY_TILE];
    for (int h = 0; h < count; h++)
        for (int j = 0; j < KEY_TILE; j++) scores[h][j] = -INFINITY;
    ptrdiff_t j = lo;
    /* VW keys at a time: vf_sum_lanes reduces them with vf_sum's own tree, so a key's score
     * has the same bits here as in the one-key loop below. */
    for (; j + VW - 1 <= hi; j += VW) {
        for (int h = 0; h < count; h++) {
            /* One head's query at a time, loaded again for each run of keys: the barrier keeps
             * the compiler from hoisting the loads, as all heads' queries held in registers
             * would push the key dots out of them. */
            __asm__ volatile("" ::: "memory");
            vf q[MAX_HEAD_VECTORS], dots[VW];
            load_query(query + h * dim, vectors, tail, q);
            /* Unrolled (ATTENTION_KEY_UNROLL keys), so that the keys' independent chains of
             * fused multiply-adds interleave; the order of operations is the same for any
             * unroll. */
            UNROLL_BY(ATTENTION_KEY_UNROLL)
            for (int k = 0; k < VW; k++)
                dots[k] =
                    key_dot(q, keys + key_slot(p, row, j + k, in_order) * dim, vectors, tail);
            vf_store(scores[h] + (j - start), vf_mul(vf_sum_lanes(dots), vf_set1(p->scale)));
        }
    }
    for (; j <= hi; j++)
        for (int h = 0; h < count; h++) {
            vf q[MAX_HEAD_VECTORS];
            load_query(query + h * dim, vectors, tail, q);
            scores[h][j - start] =
                vf_sum(key_dot(q, keys + key_slot(p, row, j, in_order) * dim, vectors, tail)) *
                p->scale;
        }
    vf acc[MAX_SIDE_BY_SIDE][MAX_HEAD_VECTORS];
    for (int h = 0; h < count; h++) {
        float *score = scores[h];
        vf tile_max = vf_load(score);
        for (int v = 1; v < KEY_TILE / VW; v++)
            tile_max = vf_max(tile_max, vf_load(score + v * VW));
        const float top = vf_max_all(tile_max);
        const float new_max = top > running_max[h] ? top : running_max[h];
        const vf shift = vf_set1(new_max);
        vf tile_sum = vf_zero();
        for (int v = 0; v < KEY_TILE / VW; v++) {
            vf weight = vector_exp(vf_sub(vf_load(score + v * VW), shift));
            vf_store(score + v * VW, weight);
            tile_sum = vf_add(tile_sum, weight);
        }
        float rescale[VW];
        vf_store(rescale, vector_exp(vf_set1(running_max[h] - new_max)));
        const vf alpha = vf_set1(rescale[0]);
        running_sum[h] = running_sum[h] * rescale[0] + vf_sum(tile_sum);
        running_max[h] = new_max;
        for (ptrdiff_t v = 0; v < all; v++) acc[h][v] = vf_mul(acc_state[h * all + v], alpha);
    }
    for (ptrdiff_t k = lo; k <= hi; k++) {
        const float *value = values + key_slot(p, row, k, in_order) * dim;
        vf weight[MAX_SIDE_BY_SIDE];
        for (int h = 0; h < count; h++) weight[h] = vf_set1(scores[h][k - start]);
        for (ptrdiff_t v = 0; v < vectors; v++) {
            const vf part = vf_load(value + v * VW);
            for (int h = 0; h < count; h++) acc[h][v] = vf_fma(weight[h], part, acc[h][v]);
        }
        if (tail) {
            const vf part = vf_load_partial(value + vectors * VW, tail);
            for (int h = 0; h < count; h++)
                acc[h][vectors] = vf_fma(weight[h], part, acc[h][vectors]);
        }
    }
    for (int h = 0; h < count; h++)
        for (ptrdiff_t v = 0; v < all; v++) acc_state[h * all + v] = acc[h][v];
}

#if defined(EXACTDRAFT_SINK_AFTER_KEYS)
/* Only for the tests' negative control: the sink merged once after the last key tile, the
 * same function with another order (the softmax then starts from (-inf, 0)). */
#define SINK_FIRST(p) 0
static void sinks_after_keys(const struct attention_problem *p, const ptrdiff_t rows,
                             const ptrdiff_t head0, const int count, const ptrdiff_t all,
                             vf *acc_state, float running_max[][MAX_SIDE_BY_SIDE],
                             float running_sum[][MAX_SIDE_BY_SIDE])
{
    for (ptrdiff_t r = 0; r < rows; r++)
        for (int h = 0; h < count; h++) {
            const float sink = p->sinks[head0 + h];
            const float new_max = sink > running_max[r][h] ? sink : running_max[r][h];
            float terms[2][VW];
            vf_store(terms[0], vector_exp(vf_set1(running_max[r][h] - new_max)));
            vf_store(terms[1], vector_exp(vf_set1(sink - new_max)));
            running_sum[r][h] = running_sum[r][h] * terms[0][0] + terms[1][0];
            running_max[r][h] = new_max;
            vf *acc = acc_state + (r * count + h) * all;
            for (ptrdiff_t v = 0; v < all; v++) acc[v] = vf_mul(acc[v], vf_set1(terms[0][0]));
        }
}
#else
#define SINK_FIRST(p) ((p)->sinks != NULL)
#endif

/* Query heads head0 .. head0 + count - 1 of rows row0 .. row0 + rows - 1 (rows <=
 * ATTENTION_ROW_BLOCK): tile by tile, each row that sees a tile takes its turn on it, so a
 * tile's keys and values are read from memory once for the block. */
static ALWAYS_INLINE void attention_heads(const struct attention_problem *p, ptrdiff_t row0,
                                          const ptrdiff_t rows, ptrdiff_t head0, const int count,
                                          const ptrdiff_t vectors, const int tail)
{
    const ptrdiff_t dim = p->head_dim;
    const ptrdiff_t kv_head = head0 / (p->heads / p->kv_heads);
    const float *keys = p->keys + kv_head * p->capacity * dim;
    const float *values = p->values + kv_head * p->capacity * dim;
    const ptrdiff_t all = vectors + (tail ? 1 : 0);
    vf acc_state[ATTENTION_ROW_BLOCK * count * all]; /* [rows, count, all] */
    float running_max[ATTENTION_ROW_BLOCK][MAX_SIDE_BY_SIDE];
    float running_sum[ATTENTION_ROW_BLOCK][MAX_SIDE_BY_SIDE];
    ptrdiff_t first[ATTENTION_ROW_BLOCK], position[ATTENTION_ROW_BLOCK];
    ptrdiff_t tiles_from = PTRDIFF_MAX, tiles_to = -1;
    for (ptrdiff_t r = 0; r < rows; r++) {
        position[r] = (ptrdiff_t)p->positions[row0 + r];
        first[r] = 0;
        if (p->window > 0 && position[r] - p->window + 1 > 0)
            first[r] = position[r] - p->window + 1;
        for (ptrdiff_t v = 0; v < count * all; v++) acc_state[r * count * all + v] = vf_zero();
        for (int h = 0; h < count; h++) {
            running_max[r][h] = SINK_FIRST(p) ? p->sinks[head0 + h] : -INFINITY;
            running_sum[r][h] = SINK_FIRST(p) ? 1.0f : 0.0f;
        }
        const ptrdiff_t first_tile = first[r] / KEY_TILE * KEY_TILE;
        if (first_tile < tiles_from) tiles_from = first_tile;
        if (position[r] > tiles_to) tiles_to = position[r];
    }
    for (ptrdiff_t start = tiles_from; start <= tiles_to; start += KEY_TILE)
        for (ptrdiff_t r = 0; r < rows; r++) {
            if (start > position[r] || start + KEY_TILE <= first[r]) continue;
            const ptrdiff_t lo = start > first[r] ? start : first[r];
            const ptrdiff_t hi = min_index(start + KEY_TILE - 1, position[r]);
            vf *acc = acc_state + r * count * all;
            /* Compiled apart for tiles whose keys all sit in their own slots (every tile of a
             * chain, a tree's tiles before its base): the same operations on the same keys. */
            if (!p->tree_paths || hi < p->tree_base)
                attention_tile(p, row0 + r, head0, count, vectors, tail, start, lo, hi, keys,
                               values, acc, running_max[r], running_sum[r], 1);
            else
                attention_tile(p, row0 + r, head0, count, vectors, tail, start, lo, hi, keys,
                               values, acc, running_max[r], running_sum[r], 0);
        }
#if defined(EXACTDRAFT_SINK_AFTER_KEYS)
    if (p->sinks) sinks_after_keys(p, rows, head0, count, all, acc_state, running_max, running_sum);
#endif
    for (ptrdiff_t r = 0; r < rows; r++)
        for (int h = 0; h < count; h++) {
            const vf *acc = acc_state + (r * count + h) * all;
            float *out = p->out + ((row0 + r) * p->heads + head0 + h) * dim;
            const vf total = vf_set1(running_sum[r][h]);
            for (ptrdiff_t v = 0; v < vectors; v++) vf_store(out + v * VW, vf_div(acc[v], total));
            if (tail) vf_store_partial(out + vectors * VW, vf_div(acc[vectors], total), tail);
        }
}

typedef void (*attention_function)(const struct attention_problem *p, ptrdiff_t row0,
                                   ptrdiff_t rows, ptrdiff_t head0);

#define ATTENTION_INSTANCES(NAME, VECTORS, TAIL)                                              \
    static void NAME##_1(const struct attention_problem *p, ptrdiff_t row0, ptrdiff_t rows,   \
                           ptrdiff_t head0)                                                   \
    {                                                                                         \
        attention_heads(p, row0, rows, head0, 1, VECTORS, TAIL);                              \
    }                                                                                         \
    static void NAME##_2(const struct attention_problem *p, ptrdiff_t row0, ptrdiff_t rows,   \
                           ptrdiff_t head0)                                                   \
    {                                                                                         \
        attention_heads(p, row0, rows, head0, 2, VECTORS, TAIL);                              \
    }                                                                                         \
    static void NAME##_3(const struct attention_problem *p, ptrdiff_t row0, ptrdiff_t rows,   \
                           ptrdiff_t head0)                                                   \
    {                                                                                         \
        attention_heads(p, row0, rows, head0, 3, VECTORS, TAIL);                              \
    }                                                                                         \
    static void NAME##_4(const struct attention_problem *p, ptrdiff_t row0, ptrdiff_t rows,   \
                           ptrdiff_t head0)                                                   \
    {                                                                                         \
        attention_heads(p, row0, rows, head0, 4, VECTORS, TAIL);                              \
    }

ATTENTION_INSTANCES(attention_head64, 64 / VW, 0)
ATTENTION_INSTANCES(attention_head128, 128 / VW, 0)
ATTENTION_INSTANCES(attention_any, p->head_dim / VW, (int)(p->head_dim % VW))

static const attention_function attention_instances[3][MAX_SIDE_BY_SIDE] = {
    {attention_head64_1, attention_head64_2, attention_head64_3, attention_head64_4},
    {attention_head128_1, attention_head128_2, attention_head128_3, attention_head128_4},
    {attention_any_1, attention_any_2, attention_any_3, attention_any_4},
};

/* (KV head, block of rows) items [first, end): item i is KV head i / row_blocks and block
 * i % row_blocks of row_blocks even blocks of the rows; all the query heads of the KV head, side
 * by side in runs of heads_side_by_side, over the block's rows in runs of ATTENTION_ROW_BLOCK.
 * The blocking decides only which rows take turns on a key tile, never a row's operations. */
static void attention_groups(const struct attention_problem *p, ptrdiff_t row_blocks,
                             ptrdiff_t first, ptrdiff_t end)
{
    const int size = p->head_dim == 64 ? 0 : p->head_dim == 128 ? 1 : 2;
    const ptrdiff_t group = p->heads / p->kv_heads, side = heads_side_by_side(p->head_dim);
    for (ptrdiff_t i = first; i < end; i++) {
        const ptrdiff_t head0 = (i / row_blocks) * group, block = i % row_blocks;
        const ptrdiff_t from = block * p->rows / row_blocks;
        const ptrdiff_t to = (block + 1) * p->rows / row_blocks;
        for (ptrdiff_t row0 = from; row0 < to; row0 += ATTENTION_ROW_BLOCK) {
            const ptrdiff_t rows = min_index(ATTENTION_ROW_BLOCK, to - row0);
            for (ptrdiff_t h = 0; h < group; h += side) {
                const ptrdiff_t count = min_index(side, group - h);
                attention_instances[size][count - 1](p, row0, rows, head0 + h);
            }
        }
    }
}
