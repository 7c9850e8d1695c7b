// Causal grouped-query attention body with an optional sliding window, fp32 online softmax.
// Inputs: q [M, Hq, D] float; keys, values [Hkv, capacity, D] T; positions [M] int32_t (the
// absolute position of each query row); window [1] int32_t (0: no window); scale [1] float;
// sinks [Hq] float (each head's sink logit, -INFINITY for none). Output: out [M, Hq, D] float.
// Template: T (float, float16_t, bfloat16_t), D (head dim).
// Launch: grid (Hq * 64, M, 1), threadgroup (64, 1, 1): one (row, head) per threadgroup.
// A query at position p sees keys j <= p, and p - j < window when window > 0.
//
// Row invariance: keys are cut into 64-key chunks aligned to absolute positions (chunk c holds
// keys [64c, 64c + 64)). A row visits the chunks holding its visible keys in increasing order;
// in each chunk the scores are fma chains over d, the chunk's probabilities are added in key
// order, each output dimension adds probability * value in key order, and the chunk is merged
// into the running (max, sum, accumulator) state. Which keys and chunks a row visits depends on
// its own position and the window alone: never on M, the capacity, or the other rows.
// A head's sink (gpt-oss: one more logit in the softmax denominator, with no value) is merged
// first: the running max and sum start from it (max = sink, sum = 1) before the first chunk,
// as in every backend; with no sink they start from (-INFINITY, 0).
const int CHUNK = 64;
const int SLOTS = (D + CHUNK - 1) / CHUNK;
threadgroup float query[D];
threadgroup float probabilities[CHUNK];
threadgroup float chunk_maxima[CHUNK / 32];

const int head = int(threadgroup_position_in_grid.x);
const int row = int(threadgroup_position_in_grid.y);
const int t = int(thread_index_in_threadgroup);
const int lane = int(thread_index_in_simdgroup);
const int group = int(simdgroup_index_in_threadgroup);
const int query_heads = q_shape[1];
const int kv_heads = keys_shape[0];
const int capacity = keys_shape[1];
const int kv_head = head / (query_heads / kv_heads);
const int position = positions[row];
const int first_key = window[0] > 0 ? metal::max(0, position - window[0] + 1) : 0;
const int query_base = (row * query_heads + head) * D;
const int cache_base = kv_head * capacity * D;

for (int d = t; d < D; d += CHUNK) query[d] = q[query_base + d] * scale[0];
metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);

const float sink = sinks[head];
float running_max = sink;
float running_sum = sink == -INFINITY ? 0.0f : 1.0f;
float acc[SLOTS];
for (int s = 0; s < SLOTS; ++s) acc[s] = 0.0f;

for (int chunk = first_key / CHUNK; chunk <= position / CHUNK; ++chunk) {
  const int chunk_start = chunk * CHUNK;
  const int lo = metal::max(first_key, chunk_start);
  const int hi = metal::min(position, chunk_start + CHUNK - 1);
  const int key = chunk_start + t;
  const bool visible = key >= lo && key <= hi;

  float score = -INFINITY;
  if (visible) {
    const int key_base = cache_base + key * D;
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) dot = metal::fma(query[d], float(keys[key_base + d]), dot);
    score = dot;
  }
  const float group_max = metal::simd_max(score);
  if (lane == 0) chunk_maxima[group] = group_max;
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);

  float chunk_max = chunk_maxima[0];
  for (int i = 1; i < CHUNK / 32; ++i) chunk_max = metal::max(chunk_max, chunk_maxima[i]);
  const float new_max = metal::max(running_max, chunk_max);
  const float rescale = running_max == -INFINITY ? 0.0f : metal::exp(running_max - new_max);
  probabilities[t] = visible ? metal::exp(score - new_max) : 0.0f;
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);

  float chunk_sum = probabilities[lo - chunk_start];
  for (int j = lo + 1; j <= hi; ++j) chunk_sum = chunk_sum + probabilities[j - chunk_start];
  running_sum = metal::fma(running_sum, rescale, chunk_sum);
  for (int s = 0; s < SLOTS; ++s) {
    const int d = t + s * CHUNK;
    if (d < D) {
      float weighted = 0.0f;
      for (int j = lo; j <= hi; ++j) {
        const float value = float(values[cache_base + j * D + d]);
        weighted = metal::fma(probabilities[j - chunk_start], value, weighted);
      }
      acc[s] = metal::fma(acc[s], rescale, weighted);
    }
  }
  running_max = new_max;
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
}

for (int s = 0; s < SLOTS; ++s) {
  const int d = t + s * CHUNK;
  if (d < D) out[query_base + d] = acc[s] / running_sum;
}
