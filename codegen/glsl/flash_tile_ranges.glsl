
// The ranges of $K operands over the tile being tested: float bits ordered as uints (for
// atomicMin / atomicMax), and whether a NaN was seen; three slots of $K (each array padded to
// 16 bytes, as every shared variable: see nonfinite).
shared uint range_lo[$KR], range_hi[$KR], range_nan[$KR];
uint tile_tests = 0u;
uint iv_order(float v) { uint u = floatBitsToUint(v); return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u; }
float iv_unorder(uint k) { return uintBitsToFloat((k & 0x80000000u) != 0u ? k & 0x7fffffffu : ~k); }
void range_clear(uint slot) {
  for (uint i = slot * $Ku; i < (slot + 1u) * $Ku; ++i) { range_lo[i] = 0xffffffffu; range_hi[i] = 0u; range_nan[i] = 0u; }
}
void range_add(uint at, float v) {
  if (isnan(v)) { atomicOr(range_nan[at], 1u); return; }
  atomicMin(range_lo[at], iv_order(v));
  atomicMax(range_hi[at], iv_order(v));
}
// An operand varying along both the queries and the keys is not read (that costs as much as
// the tile): unknown.
Iv range_read(uint at, bool along_both) {
  return along_both || range_nan[at] != 0u ? iv_unknown() : Iv(iv_unorder(range_lo[at]), iv_unorder(range_hi[at]), false);
}
