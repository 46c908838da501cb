      // o += p v over the chunk's keys.
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        uint c = c0 + j * $CLANE;
        if (c >= cols) break;
        [[unroll]] for (uint g = 0u; g < DV4; ++g) {
          vec4 x = v_tile[$AT];
          [[unroll]] for (uint t = 0u; t < RPT; ++t) o[t * DV4 + g] += sc[t][j] * x;
        }
      }
