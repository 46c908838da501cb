        ds[t] = pr * (sum4(dp4[t])$DROP - $DELTA)$DMOD;
      }
      [[unroll]] for (uint g = 0u; g < D4; ++g) {
        vec4 x = $TILE[c * D4 + g];
        [[unroll]] for (uint t = 0u; t < RPT; ++t) acc[t * D4 + g] += ds[t] * x;
      }
    }
