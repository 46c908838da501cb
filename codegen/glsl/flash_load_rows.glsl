  vec4 $REG[RPT * $G];
  [[unroll]] for (uint t = 0u; t < RPT; ++t)
    [[unroll]] for (uint g = 0u; g < $G; ++g) $REG[t * $G + g] = own(t) < $OWNCOUNT ? row4_$A(own(t), g) : vec4(0.0);
