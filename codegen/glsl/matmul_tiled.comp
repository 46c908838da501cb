#version 450
#extension GL_EXT_control_flow_attributes : require
$SIXTEEN_BIT
$SPEC_CONSTANTS
const uint WM = NT / WN, TM4 = TM / 4u, BM4 = WM * TM4, BM = 4u * BM4, BN4 = WN * TN4, BN = 4u * BN4;
const uint LA = (BM * BK + NT - 1u) / NT, LB = (BK * BN + NT - 1u) / NT;  // words each invocation loads per tile
$BINDINGS
shared vec4 As[2u * BK * BM4];  // [buffer][k][row / 4]: A's tile, k-major
shared vec4 Bs[2u * BK * BN4];  // [buffer][k][column / 4]
uint M, N, K, oa, ob, m0, n0;
float la[LA], lb[LB];

// Global -> registers: the tile at depth k0, zero outside the matrices.
void load_tile(uint k0) {
  for (uint l = 0u; l < LA; ++l) {
    uint e = gl_LocalInvocationID.x + l * NT;
    $A_TILE_INDEX
    la[l] = (e < BM * BK && m0 + r < M && k0 + kk < K) ? ld0(oa + (m0 + r) * pc.a_row_stride + (k0 + kk) * pc.a_depth_stride) : 0.0;
  }
  for (uint l = 0u; l < LB; ++l) {
    uint e = gl_LocalInvocationID.x + l * NT;
    $B_TILE_INDEX
    lb[l] = (e < BK * BN && n0 + c < N && k0 + kk < K) ? ld1(ob + (k0 + kk) * pc.b_depth_stride + (n0 + c) * pc.b_col_stride) : 0.0;
  }
}

// Registers -> shared buffer `buf`.
void store_tile(uint buf) {
  for (uint l = 0u; l < LA; ++l) {
    uint e = gl_LocalInvocationID.x + l * NT;
    $A_TILE_INDEX
    if (e < BM * BK) As[(buf * BK + kk) * BM4 + r / 4u][r % 4u] = la[l];
  }
  for (uint l = 0u; l < LB; ++l) {
    uint e = gl_LocalInvocationID.x + l * NT;
    $B_TILE_INDEX
    if (e < BK * BN) Bs[(buf * BK + kk) * BN4 + c / 4u][c % 4u] = lb[l];
  }
}

void main() {
  M = pc.M; N = pc.N; K = pc.K;
  uint tx = gl_LocalInvocationID.x % WN, ty = gl_LocalInvocationID.x / WN;
  m0 = gl_WorkGroupID.y * BM; n0 = gl_WorkGroupID.x * BN;
  uint batch = gl_WorkGroupID.z, rem = batch;
  oa = 0u; ob = 0u;
$BATCH_OFFSETS
  qkv_epilogue_batch(batch);
  // Invocation (ty, tx) owns rows 4 (ty + i WM) + 0..3 for i < TM4 and columns
  // 4 (tx + j WN) + 0..3 for j < TN4: neighbours read neighbouring vec4s of B.
  vec4 acc[TM * TN4];
  [[unroll]] for (uint i = 0u; i < TM * TN4; ++i) acc[i] = vec4(0.0);
  uint tiles = (K + BK - 1u) / BK;
  load_tile(0u);
  store_tile(0u);
  barrier();
  for (uint t = 0u; t < tiles; ++t) {
    uint buf = t & 1u;
    if (t + 1u < tiles) load_tile((t + 1u) * BK);  // in flight while this tile is multiplied
    for (uint kk = 0u; kk < BK; ++kk) {
      vec4 b[TN4];
      [[unroll]] for (uint j = 0u; j < TN4; ++j) b[j] = Bs[(buf * BK + kk) * BN4 + tx + j * WN];
      [[unroll]] for (uint i = 0u; i < TM4; ++i) {
        vec4 a = As[(buf * BK + kk) * BM4 + ty + i * WM];
        [[unroll]] for (uint j = 0u; j < TN4; ++j) {
          acc[(4u * i) * TN4 + j] = fma(vec4(a.x), b[j], acc[(4u * i) * TN4 + j]);
          acc[(4u * i + 1u) * TN4 + j] = fma(vec4(a.y), b[j], acc[(4u * i + 1u) * TN4 + j]);
          acc[(4u * i + 2u) * TN4 + j] = fma(vec4(a.z), b[j], acc[(4u * i + 2u) * TN4 + j]);
          acc[(4u * i + 3u) * TN4 + j] = fma(vec4(a.w), b[j], acc[(4u * i + 3u) * TN4 + j]);
        }
      }
    }
    // The other buffer was last read before the previous barrier: safe to fill.
    if (t + 1u < tiles) store_tile(buf ^ 1u);
    barrier();
  }
  uint oy = batch * M * N;
  [[unroll]] for (uint i = 0u; i < TM4; ++i)
    [[unroll]] for (uint c = 0u; c < 4u; ++c) {
      uint row = m0 + 4u * (ty + i * WM) + c;
      if (row >= M) continue;
      [[unroll]] for (uint j = 0u; j < TN4; ++j) {
        uint col = n0 + 4u * (tx + j * WN);
        vec4 v = acc[(4u * i + c) * TN4 + j];
        for (uint q = 0u; q < 4u && col + q < N; ++q) st(oy + row * N + col + q, qkv_epilogue(v[q], row, col + q));
      }
    }
}
