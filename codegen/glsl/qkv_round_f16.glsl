// x rounded to the nearest f16 (ties to even), as a float: the quantum of x's binade (of the
// smallest normal binade below it: subnormals) is a power of two built from its bits, so the
// scaling, roundEven and scaling back are exact (not exp2 or a division, which Vulkan lets be
// inexact). Past the largest f16 (65504; 65520 rounds up), infinity; NaN and infinities pass.
float qkv_round_f16(float x) {
  if (isnan(x) || isinf(x)) return x;
  float a = abs(x);
  float r;
  if (a >= 65520.0) r = uintBitsToFloat(0x7f800000u);
  else {
    int e = max(int(floatBitsToUint(a) >> 23) - 127, -14);
    r = roundEven(a * uintBitsToFloat(uint(137 - e) << 23)) * uintBitsToFloat(uint(117 + e) << 23);
  }
  return uintBitsToFloat(floatBitsToUint(r) | (floatBitsToUint(x) & 0x80000000u));
}
