      vec4 ${OUT}4[RPT];
      [[unroll]] for (uint t = 0u; t < RPT; ++t) ${OUT}4[t] = vec4(0.0);
      [[unroll]] for (uint g = 0u; g < $G; ++g) {
        vec4 x = $TILE[$AT];
        [[unroll]] for (uint t = 0u; t < RPT; ++t) ${OUT}4[t] += $A[t * $G + g] * x;
      }
