// Dense matmul body: out[m, n] = sum over k of x[m, k] * w[n, k], fp32 accumulation.
// Inputs: x [M, K] float, w [N, K] T (float, float16_t or bfloat16_t). Output: out [M, N] float.
// Template: T. Launch: grid (ceil(N / 8) * 64, ceil(M / 4), 1), threadgroup (64, 1, 1).
//
// Row invariance: lane l of a SIMD-group owns the k with (k mod 128) in [4l, 4l + 4) and adds
// them in increasing k with fma; the 32 lane partials are then added in lane order. That order
// depends on K alone. Rows past M and columns past N read the last valid one and are never
// written, so every thread runs the same instructions whatever M is and wherever a row sits.
const int ROWS = 4;
const int COLUMNS = 4;
const int SIMDGROUPS = 2;
const int LANES = 32;
const int SPAN = 4;
threadgroup float partials[SIMDGROUPS * ROWS * COLUMNS * LANES];

const int M = x_shape[0];
const int K = x_shape[1];
const int N = w_shape[0];
const int lane = int(thread_index_in_simdgroup);
const int group = int(simdgroup_index_in_threadgroup);
const int first_row = int(threadgroup_position_in_grid.y) * ROWS;
const int block_column = int(threadgroup_position_in_grid.x) * SIMDGROUPS * COLUMNS;
const int first_column = block_column + group * COLUMNS;

int row_offset[ROWS];
int column_offset[COLUMNS];
for (int r = 0; r < ROWS; ++r) row_offset[r] = metal::min(first_row + r, M - 1) * K;
for (int c = 0; c < COLUMNS; ++c) column_offset[c] = metal::min(first_column + c, N - 1) * K;

float acc[ROWS][COLUMNS];
for (int r = 0; r < ROWS; ++r) {
  for (int c = 0; c < COLUMNS; ++c) acc[r][c] = 0.0f;
}
for (int start = lane * SPAN; start < K; start += LANES * SPAN) {
  for (int i = 0; i < SPAN; ++i) {
    const int k = start + i;
    if (k < K) {
      float xv[ROWS];
      for (int r = 0; r < ROWS; ++r) xv[r] = x[row_offset[r] + k];
      for (int c = 0; c < COLUMNS; ++c) {
        const float wv = float(w[column_offset[c] + k]);
        for (int r = 0; r < ROWS; ++r) acc[r][c] = metal::fma(xv[r], wv, acc[r][c]);
      }
    }
  }
}

for (int r = 0; r < ROWS; ++r) {
  for (int c = 0; c < COLUMNS; ++c) {
    partials[((group * ROWS + r) * COLUMNS + c) * LANES + lane] = acc[r][c];
  }
}
metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);

const int t = int(thread_index_in_threadgroup);
if (t < SIMDGROUPS * ROWS * COLUMNS) {
  float total = partials[t * LANES];
  for (int l = 1; l < LANES; ++l) total = total + partials[t * LANES + l];
  const int row = first_row + (t / COLUMNS) % ROWS;
  const int column = block_column + (t / (ROWS * COLUMNS)) * COLUMNS + t % COLUMNS;
  if (row < M && column < N) out[row * N + column] = total;
}
