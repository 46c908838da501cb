#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
$SIXTEEN_BIT
// The tile, per launch (lanes_tile): RG groups of $SG rows by $SG TN columns per subgroup. The
// code below is unrolled for the largest tile; what a smaller one does not use is folded away.
$SPEC_CONSTANTS
$BINDINGS
// A subgroup computes RG * $SG rows by TN * $SG columns; lane l owns columns c0 + j * $SG + l.
void main() {
  uint M = pc.M, N = pc.N, K = pc.K;
  if (M == 0u || N == 0u) return;
  uint lane = gl_SubgroupInvocationID;
  uint r0 = (gl_WorkGroupID.y * gl_NumSubgroups + gl_SubgroupID) * (RG * $SGu), c0 = gl_WorkGroupID.x * (TN * $SGu);
  if (r0 >= M) return;  // a subgroup wholly past the last row (no barrier waits for it)
  uint batch = gl_WorkGroupID.z, rem = batch, oa = 0u, ob = 0u;
$BATCH_OFFSETS
  qkv_epilogue_batch(batch);
  // Rows and columns past the matrix (or the tile) read its last one (so every load is in bounds) and count as 0.
$OPERANDS
$ACCUMULATORS
  for (uint k = 0u; k < K; ++k) {
$LOADS
$PRODUCTS
  }
  uint oy = batch * M * N;
$STORES
}
