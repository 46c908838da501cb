vec4 row4_$A(uint row, uint g) {
  uint at, d = 4u * g;
  if (!row_at_$A(row, at)) return vec4(0.0);
  return vec4(d < $W ? load_$A(at + d) : 0.0, d + 1u < $W ? load_$A(at + d + 1u) : 0.0,
              d + 2u < $W ? load_$A(at + d + 2u) : 0.0, d + 3u < $W ? load_$A(at + d + 3u) : 0.0);
}
