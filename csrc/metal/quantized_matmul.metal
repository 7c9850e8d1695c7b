// Affine-quantized matmul body in MLX's layout (as mx.quantize writes it):
// out[m, n] = sum over groups g of (scale[n, g] * sum_k x[m, k] q[n, k] + bias[n, g] * sum_k x[m, k]).
// Inputs: x [M, K] float; w [N, K * BITS / 32] uint32_t, element k of a row in bits
// [BITS * (k mod (32 / BITS)), ...) of word k / (32 / BITS); scales, biases [N, K / GROUP] S.
// Output: out [M, N] float. Template: S, BITS (4 or 8), GROUP (32 or 64).
// Launch: grid (ceil(N / 8) * 64, ceil(M / 4), 1), threadgroup (64, 1, 1).
//
// Row invariance: a group's product is computed by one lane, k in increasing order, and
// turned into fma(scale, dot, bias * xsum); lane l adds the products of groups l, l + 32, ... in
// that order, and the 32 lane partials are added in lane order. That order depends on K and
// GROUP alone; padded rows and columns are read but never written.
const int ROWS = 4;
const int COLUMNS = 4;
const int SIMDGROUPS = 2;
const int LANES = 32;
const int PER_WORD = 32 / BITS;
const int WORDS_PER_GROUP = GROUP / PER_WORD;
const uint MASK = (1u << BITS) - 1u;
threadgroup float partials[SIMDGROUPS * ROWS * COLUMNS * LANES];

const int M = x_shape[0];
const int K = x_shape[1];
const int N = w_shape[0];
const int words_per_row = w_shape[1];
const int groups = K / GROUP;
const int lane = int(thread_index_in_simdgroup);
const int group = int(simdgroup_index_in_threadgroup);
const int first_row = int(threadgroup_position_in_grid.y) * ROWS;
const int block_column = int(threadgroup_position_in_grid.x) * SIMDGROUPS * COLUMNS;
const int first_column = block_column + group * COLUMNS;

int row_offset[ROWS];
int column_index[COLUMNS];
for (int r = 0; r < ROWS; ++r) row_offset[r] = metal::min(first_row + r, M - 1) * K;
for (int c = 0; c < COLUMNS; ++c) column_index[c] = metal::min(first_column + c, N - 1);

float acc[ROWS][COLUMNS];
for (int r = 0; r < ROWS; ++r) {
  for (int c = 0; c < COLUMNS; ++c) acc[r][c] = 0.0f;
}
for (int g = lane; g < groups; g += LANES) {
  float dot[ROWS][COLUMNS];
  float xsum[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    xsum[r] = 0.0f;
    for (int c = 0; c < COLUMNS; ++c) dot[r][c] = 0.0f;
  }
  for (int word_in_group = 0; word_in_group < WORDS_PER_GROUP; ++word_in_group) {
    uint words[COLUMNS];
    for (int c = 0; c < COLUMNS; ++c) {
      words[c] = w[column_index[c] * words_per_row + g * WORDS_PER_GROUP + word_in_group];
    }
    for (int j = 0; j < PER_WORD; ++j) {
      const int k = g * GROUP + word_in_group * PER_WORD + j;
      float xv[ROWS];
      for (int r = 0; r < ROWS; ++r) {
        xv[r] = x[row_offset[r] + k];
        xsum[r] = xsum[r] + xv[r];
      }
      for (int c = 0; c < COLUMNS; ++c) {
        const float q = float((words[c] >> (BITS * j)) & MASK);
        for (int r = 0; r < ROWS; ++r) dot[r][c] = metal::fma(xv[r], q, dot[r][c]);
      }
    }
  }
  for (int c = 0; c < COLUMNS; ++c) {
    const float scale = float(scales[column_index[c] * groups + g]);
    const float bias = float(biases[column_index[c] * groups + g]);
    for (int r = 0; r < ROWS; ++r) {
      acc[r][c] = acc[r][c] + metal::fma(scale, dot[r][c], bias * xsum[r]);
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
