// Softmax body over the last dimension: out[m, n] = exp(x[m, n] - max) / sum exp(x[m, :] - max).
// Input: x [M, N] float. Output: out [M, N] float.
// Launch: grid (256, M, 1), threadgroup (256, 1, 1): one row per threadgroup.
//
// Row invariance: the maximum is exact in any order; thread t sums exp(x - max) over
// n = t, t + 256, ... in increasing n; threads 0..31 each add 8 consecutive thread sums in order,
// and every thread adds those 32 in order. Nothing depends on M or on the other rows.
const int THREADS = 256;
const int SUBTOTALS = 32;
threadgroup float maxima[THREADS / 32];
threadgroup float partials[THREADS];
threadgroup float subtotals[SUBTOTALS];

const int N = x_shape[1];
const int row = int(threadgroup_position_in_grid.y);
const int t = int(thread_index_in_threadgroup);
const int lane = int(thread_index_in_simdgroup);
const int group = int(simdgroup_index_in_threadgroup);
const int base = row * N;

float local_max = -INFINITY;
for (int n = t; n < N; n += THREADS) local_max = metal::max(local_max, x[base + n]);
local_max = metal::simd_max(local_max);
if (lane == 0) maxima[group] = local_max;
metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
float row_max = maxima[0];
for (int i = 1; i < THREADS / 32; ++i) row_max = metal::max(row_max, maxima[i]);

float sum = 0.0f;
for (int n = t; n < N; n += THREADS) sum = sum + metal::exp(x[base + n] - row_max);
partials[t] = sum;
metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
if (t < SUBTOTALS) {
  const int per = THREADS / SUBTOTALS;
  float subtotal = partials[t * per];
  for (int i = 1; i < per; ++i) subtotal = subtotal + partials[t * per + i];
  subtotals[t] = subtotal;
}
metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
float total = subtotals[0];
for (int i = 1; i < SUBTOTALS; ++i) total = total + subtotals[i];

for (int n = t; n < N; n += THREADS) out[base + n] = metal::exp(x[base + n] - row_max) / total;
