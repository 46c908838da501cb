// Attention sinks (sink_softmax): row i's sink logit, a weight with no value in its softmax.
float sink_logit(uint i) { return $LOGIT; }
// Folds a row's sink logit s into its running max m and sum l (over its keys so far); returns
// the factor the row's output, relative to the old max, is multiplied by. A sink of -inf changes
// nothing; a NaN or +inf one makes the row NaN, as the meaning's exp(inf - inf) does; a row
// without keys gets l = 1, its weights zeros.
float fold_sink(float s, inout float m, inout float l) {
  if (s == neg_inf()) return 1.0;
  float t = qkv_max(m, s);
  float c = m == neg_inf() ? 0.0 : exp(m - t);
  l = l * c + exp(s - t);
  m = t;
  return c;
}
