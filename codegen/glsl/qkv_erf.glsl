// erf for GLSL, which has none. Below |x| = 1 its Taylor series in x^2 (coefficients
// 2/sqrt(pi) (-1)^n / (n! (2n+1)), n <= 12; alternating with largest term 1, so float keeps its
// precision even where erf is small); above, Abramowitz and Stegun 7.1.26 (absolute error
// below 1.5e-7, where erf >= 0.84).
float qkv_erf(float x) {
  if (abs(x) < 1.0) {
    float x2 = x * x;
    float p = 9.422759065e-11;
    p = p * x2 + -1.229055530e-09;
    p = p * x2 + 1.480719282e-08;
    p = p * x2 + -1.636584469e-07;
    p = p * x2 + 1.646211437e-06;
    p = p * x2 + -1.492565036e-05;
    p = p * x2 + 1.205533298e-04;
    p = p * x2 + -8.548327023e-04;
    p = p * x2 + 5.223977625e-03;
    p = p * x2 + -2.686617065e-02;
    p = p * x2 + 1.128379167e-01;
    p = p * x2 + -3.761263890e-01;
    p = p * x2 + 1.128379167e+00;
    return x * p;
  }
  float t = 1.0 / (1.0 + 0.3275911 * abs(x));
  float q = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  return sign(x) * (1.0 - q * exp(-x * x));
}
