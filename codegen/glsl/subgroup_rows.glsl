// Rows shared across lanes, in one of three ways chosen per launch by pc.mode (axis_launch): 0, an
// invocation per row (short rows); 1, a subgroup per row, lane l reading the row's elements l,
// l + S, ... (S = gl_SubgroupSize as the device runs it) and subgroupAdd or subgroupMax combining
// the lanes, the workgroup's subgroups taking its kRows rows in turn (so nothing assumes the
// subgroup size the host queried); 2, a workgroup per row (long rows on a GPU), its subgroups'
// results then combined through shared memory.
const uint kRows = $ROWSu;  // per workgroup with a subgroup per row
shared float qkv_partial[$INVOCATIONS];  // a subgroup's result each (at most one per invocation)
uint mode;  // uniform: a push constant
// The workgroup's subgroups' x combined through shared memory (mode 2), by sum or by max.
float qkv_across_subgroups(float x, bool by_max) {
  barrier();  // earlier reads of qkv_partial are done
  if (subgroupElect()) qkv_partial[gl_SubgroupID] = x;
  barrier();
  x = qkv_partial[0];
  for (uint s = 1u; s < gl_NumSubgroups; ++s) x = by_max ? max(x, qkv_partial[s]) : x + qkv_partial[s];
  return x;
}
float qkv_sum(float x) {  // of the lanes sharing a row
  if (mode == 0u) return x;
  x = subgroupAdd(x);
  return mode == 1u ? x : qkv_across_subgroups(x, false);
}
float qkv_max(float x) {  // of the lanes sharing a row
  if (mode == 0u) return x;
  x = subgroupMax(x);
  return mode == 1u ? x : qkv_across_subgroups(x, true);
}
void main() {
  uint rows = pc.rows, n = pc.n, inner = pc.inner;
  mode = pc.mode;
  uint group = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint first = mode == 0u ? group * gl_WorkGroupSize.x + gl_LocalInvocationID.x : mode == 1u ? group * kRows : group;
  uint count = mode == 1u ? kRows : 1u, r0 = mode == 1u ? gl_SubgroupID : 0u, rstep = mode == 1u ? gl_NumSubgroups : 1u;
  uint lane = mode == 0u ? 0u : mode == 1u ? gl_SubgroupInvocationID : gl_LocalInvocationID.x;
  uint step = mode == 0u ? 1u : mode == 1u ? gl_SubgroupSize : gl_WorkGroupSize.x;
  bool writer = mode == 0u || (mode == 1u ? subgroupElect() : gl_LocalInvocationID.x == 0u);
  for (uint r = r0; r < count; r += rstep) {
    uint i = first + r;
    if (i >= rows) break;  // uniform across the lanes sharing a row
    uint base = (i / inner) * n * inner + i % inner;
    // The row's elements are base + k * inner for k = lane, lane + step, ... below n.
$ROW
  }
}
