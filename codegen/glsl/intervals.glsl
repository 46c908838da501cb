// Interval arithmetic (ir::bound_region's rules): every value lies in [lo, hi] or, when nan, may be NaN.
struct Iv { float lo; float hi; bool nan; };
float iv_inf() { return uintBitsToFloat(0x7f800000u); }
Iv iv_unknown() { return Iv(-iv_inf(), iv_inf(), true); }
Iv iv_exact(float v) { return isnan(v) ? iv_unknown() : Iv(v, v, false); }
bool iv_holds(Iv a, float v) { return a.lo <= v && v <= a.hi; }
bool iv_unbounded(Iv a) { return a.lo == -iv_inf() || a.hi == iv_inf(); }
bool iv_is(Iv a, float v) { return !a.nan && a.lo == v && a.hi == v; }
Iv iv_negated(Iv a) { return Iv(-a.hi, -a.lo, a.nan); }  // iv_neg, the op, is generated
float iv_end_sum(float a, float b, float fallback) { float s = a + b; return isnan(s) ? fallback : s; }
Iv iv_add(Iv a, Iv b) {
  bool inf_minus_inf = (a.lo == -iv_inf() && b.hi == iv_inf()) || (a.hi == iv_inf() && b.lo == -iv_inf());
  return Iv(iv_end_sum(a.lo, b.lo, -iv_inf()), iv_end_sum(a.hi, b.hi, iv_inf()), a.nan || b.nan || inf_minus_inf);
}
Iv iv_sub(Iv a, Iv b) { return iv_add(a, iv_negated(b)); }
float iv_corner(float x, float y) { float p = x * y; return isnan(p) ? 0.0 : p; }  // 0 * inf
Iv iv_mul(Iv a, Iv b) {
  bool zero_times_inf = (iv_holds(a, 0.0) && iv_unbounded(b)) || (iv_holds(b, 0.0) && iv_unbounded(a));
  float p0 = iv_corner(a.lo, b.lo), p1 = iv_corner(a.lo, b.hi), p2 = iv_corner(a.hi, b.lo), p3 = iv_corner(a.hi, b.hi);
  return Iv(min(min(p0, p1), min(p2, p3)), max(max(p0, p1), max(p2, p3)), a.nan || b.nan || zero_times_inf);
}
Iv iv_div(Iv a, Iv b) {
  if (iv_holds(b, 0.0) || (iv_unbounded(a) && iv_unbounded(b))) return iv_unknown();
  float p0 = a.lo / b.lo, p1 = a.lo / b.hi, p2 = a.hi / b.lo, p3 = a.hi / b.hi;
  return Iv(min(min(p0, p1), min(p2, p3)), max(max(p0, p1), max(p2, p3)), a.nan || b.nan);
}
Iv iv_max(Iv a, Iv b) { return Iv(max(a.lo, b.lo), max(a.hi, b.hi), a.nan || b.nan); }
Iv iv_bool(bool can_be_false, bool can_be_true) { return Iv(can_be_false ? 0.0 : 1.0, can_be_true ? 1.0 : 0.0, false); }
Iv iv_equal(Iv a, Iv b) {  // a comparison with NaN is false
  bool disjoint = a.hi < b.lo || b.hi < a.lo;
  bool one_value = !a.nan && !b.nan && a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
  return iv_bool(!one_value, !disjoint);
}
Iv iv_greater(Iv a, Iv b) { return iv_bool(a.nan || b.nan || a.lo <= b.hi, a.hi > b.lo); }
Iv iv_where(Iv c, Iv x, Iv y) {
  if (!c.nan && !iv_holds(c, 0.0)) return x;  // always true
  if (iv_is(c, 0.0)) return y;
  return Iv(min(x.lo, y.lo), max(x.hi, y.hi), x.nan || y.nan);
}
Iv iv_periodic(Iv a) { return Iv(-1.0, 1.0, a.nan || iv_unbounded(a)); }  // Monotone::periodic
