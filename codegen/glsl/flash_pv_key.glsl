        // o += p v for the key.
        [[unroll]] for (uint g = 0u; g < DV4; ++g) {
          vec4 x = v_tile[$AT];
          [[unroll]] for (uint t = 0u; t < RPT; ++t) o[t * DV4 + g] += p[t] * x;
        }
