// x rounded to the nearest bf16 (ties to even) on its bits: the high half of the f32, carried
// up past the halfway point (into infinity past the largest); NaN passes.
float qkv_round_bf16(float x) {
  if (isnan(x)) return x;
  uint u = floatBitsToUint(x);
  return uintBitsToFloat((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
