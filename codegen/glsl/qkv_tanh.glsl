// tanh for GLSL: lavapipe's built-in loses the relative precision of small arguments (about
// 1e-7 absolute on tanh of a softmax weight, 30x the budget; found by the random-graph test).
// Below |x| = 0.25 the odd Taylor series to x^11 (the next term is 2e-10 relative); up to 0.55,
// (1 - e) / (1 + e) with e = e^-2|x|; beyond, 1 - 2e / (1 + e), whose small correction carries
// exp's error at a fraction of an ulp of the result (1 - tanh^2, tanh's gradient, magnifies any
// error near saturation). Never overflows; the sign restored last.
float qkv_tanh(float x) {
  float a = abs(x);
  if (a < 0.25) {
    float x2 = x * x;
    float p = 0.021869488536155203 + x2 * -0.0088632355299021973;
    p = 0.13333333333333333 + x2 * (-0.053968253968253971 + x2 * p);
    return x + x * x2 * (-0.33333333333333333 + x2 * p);
  }
  if (isnan(x)) return x;
  float e = exp(-2.0 * a);
  return sign(x) * (a < 0.55 ? (1.0 - e) / (1.0 + e) : 1.0 - 2.0 * e / (1.0 + e));
}
