// log for GLSL: the built-in may be off by 2^-21 absolute in [0.5, 2] (the spec's bound, and
// lavapipe's), several times the float64-anchored budget where log is near 0 (found by the
// random-graph test). Here log(m 2^e) = e ln 2 + 2 atanh(s), s = (m - 1) / (m + 1), m in
// [sqrt(1/2), sqrt(2)), so |s| < 0.172 and the odd series to s^11 is exact to float; special
// values as IEEE log.
float qkv_log(float x) {
  if (isnan(x) || x < 0.0) return uintBitsToFloat(0x7fc00000u);
  if (x == 0.0) return uintBitsToFloat(0xff800000u);
  if (isinf(x)) return x;
  int e;
  float m = frexp(x, e);
  if (m < 0.70710678) { m *= 2.0; e -= 1; }
  float s = (m - 1.0) / (m + 1.0), s2 = s * s;
  float p = s2 * (0.33333333 + s2 * (0.2 + s2 * (0.14285714 + s2 * (0.11111111 + s2 * 0.09090909))));
  return float(e) * 0.69314718 + (2.0 * s + 2.0 * s * p);
}
