#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
$SIXTEEN_BIT
$COOPERATIVE_EXTENSIONS
$SPEC_CONSTANTS
const uint CM = $CM, CN = $CN, CK = $CK;  // the device's fragment: CM x CK times CK x CN
const uint FM = $FRAGMENTS, FN = $FRAGMENTS;  // fragments per subgroup
const uint SM = $SUBGROUPS, SN = $SUBGROUPS, SG = $SG;  // subgroups, invocations per subgroup
const uint BM = SM * FM * CM, BN = SN * FN * CN, BK = 2u * CK, NT = SM * SN * SG;
const uint AS = BK + 8u, BS = BN + 8u, CS = BN + 4u;  // shared row strides, padded
const uint LA = BM * BK / NT, LB = BK * BN / NT, LC = BM * BN / NT;  // elements each invocation stages or stores
$BINDINGS
shared float16_t As[BM * AS];  // A's tile, rows of BK
shared float16_t Bs[BK * BS];  // B's tile, rows of BN
shared float Cs[BM * CS];      // the accumulators, for the epilogue's stores
uint r0, c0;  // this subgroup's first row and column in the tile

$FRAGMENT_OPERATIONS
void main() {
  uint M = pc.M, N = pc.N, K = pc.K;
  uint lid = gl_LocalInvocationID.x;
  uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
  r0 = (gl_SubgroupID / SN) * FM * CM;
  c0 = (gl_SubgroupID % SN) * FN * CN;
  uint batch = gl_WorkGroupID.z, rem = batch, oa = 0u, ob = 0u;
$BATCH_OFFSETS
  qkv_epilogue_batch(batch);
  zero();
  for (uint k0 = 0u; k0 < K; k0 += BK) {
    // Stage the tiles, invocations stepping along each operand's contiguous index.
    for (uint l = 0u; l < LA; ++l) {
      uint e = lid + l * NT;
      $A_TILE_INDEX
      As[r * AS + kk] = float16_t(m0 + r < M && k0 + kk < K ? ld0(oa + (m0 + r) * pc.a_row_stride + (k0 + kk) * pc.a_depth_stride) : 0.0);
    }
    for (uint l = 0u; l < LB; ++l) {
      uint e = lid + l * NT;
      $B_TILE_INDEX
      Bs[kk * BS + c] = float16_t(n0 + c < N && k0 + kk < K ? ld1(ob + (k0 + kk) * pc.b_depth_stride + (n0 + c) * pc.b_col_stride) : 0.0);
    }
    barrier();
    [[unroll]] for (uint kk = 0u; kk < BK; kk += CK) multiply(kk);
    barrier();  // every subgroup is done with the tiles before they are staged again
  }
  keep();
  barrier();
  uint oy = batch * M * N;
  for (uint l = 0u; l < LC; ++l) {
    uint e = lid + l * NT, r = e / BN, c = e % BN;
    if (m0 + r < M && n0 + c < N) st(oy + (m0 + r) * N + n0 + c, qkv_epilogue(Cs[r * CS + c], m0 + r, n0 + c));
  }
}
