uint score_dim(int d) { return d < R ? pc.batch[d] : d == R ? N : M; }
// A tensor's element stride along the scores' dim d: 0 where it broadcasts, else the product of
// the later dims it spans.
uint tensor_stride(uint dims, int d) {
  if (((dims >> uint(d)) & 1u) == 0u) return 0u;
  uint st = 1u;
  for (int e = d + 1; e < R + 2; ++e)
    if (((dims >> uint(e)) & 1u) != 0u) st *= score_dim(e);
  return st;
}
