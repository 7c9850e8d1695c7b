// RMS norm body: out[m, k] = x[m, k] * (1 / sqrt(mean_k(x[m, k]^2) + eps)) * w[k], all fp32.
// Inputs: x [M, K] float, w [K] float, eps [1] float. Output: out [M, K] float.
// Launch: grid (256, M, 1), threadgroup (256, 1, 1): one row per threadgroup.
//
// Row invariance: thread t sums the squares of k = t, t + 256, ... in increasing k; threads
// 0..31 each add 8 consecutive thread sums in order, and every thread adds those 32 in order.
// Nothing depends on M or on the other rows.
const int THREADS = 256;
const int SUBTOTALS = 32;
threadgroup float partials[THREADS];
threadgroup float subtotals[SUBTOTALS];

const int K = x_shape[1];
const int row = int(threadgroup_position_in_grid.y);
const int t = int(thread_index_in_threadgroup);
const int base = row * K;

float sum_of_squares = 0.0f;
for (int k = t; k < K; k += THREADS) {
  const float v = x[base + k];
  sum_of_squares = metal::fma(v, v, sum_of_squares);
}
partials[t] = sum_of_squares;
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

const float inverse = 1.0f / metal::sqrt(total / float(K) + eps[0]);
for (int k = t; k < K; k += THREADS) out[base + k] = x[base + k] * inverse * w[k];
