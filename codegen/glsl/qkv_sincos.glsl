// sin and cos for GLSL: the built-ins need only be within 2^-11 of the result on [-pi, pi] (the
// Vulkan specification's bound); NVIDIA's, a hardware approximation, err by about 1e-7 absolute,
// a dozen ulps of sin(0.1) and twice the float64-anchored budget (found by the random-graph test
// on an H200). Here |x| = j pi/2 + r, j = floor(|x| 2/pi + 1/2), with pi/2 in four 8-bit parts
// and a fifth in full (Cody and Waite): each part's product with j is exact below j = 2^16, so r
// is exact to about 1e-19 j, and |r| <= pi/4 takes Cephes' sinf and cosf polynomials (within an
// ulp). The built-in beyond |x| = 1e5, where the products stop being exact; NaN for NaN and the
// infinities, as IEEE.
vec2 qkv_sincos(float x) {  // (sin x, cos x)
  float a = abs(x);
  if (!(a <= 1.0e5)) return isnan(x) || isinf(x) ? vec2(uintBitsToFloat(0x7fc00000u)) : vec2(sin(x), cos(x));
  float j = floor(a * 0.63661977 + 0.5);
  float r = a - j * 1.5703125;
  r -= j * 4.825592041015625e-4;
  r -= j * 1.2665987014770508e-6;
  r -= j * 9.89530235528946e-10;
  r -= j * 2.5633440682570896e-12;
  float z = r * r;
  float s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
  float c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
  uint q = uint(j) & 3u;
  vec2 sc = q == 0u ? vec2(s, c) : q == 1u ? vec2(c, -s) : q == 2u ? vec2(-s, -c) : vec2(-c, s);
  return vec2((floatBitsToUint(x) >> 31) != 0u ? -sc.x : sc.x, sc.y);  // the sign bit: sin(-0) is -0
}
float qkv_sin(float x) { return qkv_sincos(x).x; }
float qkv_cos(float x) { return qkv_sincos(x).y; }
