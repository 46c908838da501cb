for (uint x = lid; x < $COUNT * ($W / 4u); x += INV) {
  uint row = x / ($W / 4u), g = x % ($W / 4u);
  vec4 v = $IN && g < $G ? $READ($FIRST + row, g) : vec4(0.0);
  [[unroll]] for (uint e = 0u; e < 4u; ++e) $A[row * $S + 4u * g + e] = float16_t(v[e]);
}
