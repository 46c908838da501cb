vec4 row4_$A(uint row, uint g) {
  uint at = $AT + row * $RS, d = 4u * g;
  return vec4(d < $W ? load_$A(at + d) : 0.0, d + 1u < $W ? load_$A(at + d + 1u) : 0.0,
              d + 2u < $W ? load_$A(at + d + 2u) : 0.0, d + 3u < $W ? load_$A(at + d + 3u) : 0.0);
}
