#version 450
#extension GL_EXT_control_flow_attributes : require
$SIXTEEN
$COOPEXT
// Flash attention, $KIND: a workgroup takes BR $ROWS of one batch entry, RPT per invocation,
// and streams the $OTHERS through shared memory BC at a time.
$SPECS
$COOPCONSTS
const uint INV = gl_WorkGroupSize.x, BR = $BR;
const int R = $R;
$BINDINGS
$PUSH
// [0]: whether a row the tiles skip holds inf or NaN. Every shared variable's size is a multiple
// of 16 bytes, so that wherever the compiler places them the cooperative-matrix loads and stores
// find their tiles 16-byte aligned (NVIDIA's driver placed a lone uint first: every load was off).
$COOPDECL
$TILES
shared uint nonfinite[4];
$SPLITDECL
uint N, M, DR, DVR;  // the bound sizes
float scale;
int shift, window;
uint q_at, k_at, v_at, mask_at, dy_at, stat_at, out_at;  // this batch entry's first element in each operand
uint k_table, v_table;  // paged keys, values: this sequence's first block-table entry (and k_at, v_at the head's within a page)
uint q_rs, k_rs, v_rs, dy_rs, out_rs;  // elements between rows
uint r0, lid;
uint batch_index, drop_seed;  // dropout's: this workgroup's batch entry and the seed
$TGLOBALS
float neg_inf() { return uintBitsToFloat(0xff800000u); }
float qkv_max(float a, float b) { return (isnan(a) || a > b) ? a : b; }  // NaN wins, as max does
bool finite(float x) { return !isnan(x) && !isinf(x); }
float sum4(vec4 v) { return (v.x + v.y) + (v.z + v.w); }
uint own(uint t) { return $OWN; }  // row t of this invocation
$READERS
$MODIFIER
$DROPOUT
$TILETEST
// Whether query i keeps key j: causality keeps j <= i + shift, a window only the last `window`.
bool kept(uint i, uint j) {
  bool keep = true;
$KEPT
  return keep;
}

void main() {
  N = pc.queries; M = pc.keys; DR = pc.head_dim; DVR = pc.value_dim;
  scale = pc.scale; shift = pc.shift; window = pc.window;
  uint batches = 1u;
  for (int d = 0; d < R; ++d) batches *= pc.batch[d];
  uint b = gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y;
  if (b >= batches) return;  // uniform: the whole workgroup
  q_at = 0u; k_at = 0u; v_at = 0u; mask_at = 0u; dy_at = 0u; out_at = 0u;$TENSORZERO
  uint rem = b;
  for (int d = R - 1; d >= 0; --d) {
    uint idx = rem % pc.batch[d];
    rem /= pc.batch[d];
    q_at += idx * pc.q_batch_strides[d];
    k_at += idx * pc.k_batch_strides[d];
    v_at += idx * pc.v_batch_strides[d];
    mask_at += idx * pc.mask_batch_strides[d];
$TENSORAT
$STRIDEDAT
  }
$TENSORSTRIDES
$DROPSETUP
$ROWSTRIDES
  stat_at = b * N;
  lid = gl_LocalInvocationIndex;
  r0 = $BLOCK * BR;
  uint rows = min(BR, $OWNCOUNT - min(r0, $OWNCOUNT));
  uint lo = 0u, hi = $OTHERCOUNT;  // the streamed rows visited
