      // A chunk of four keys' scores, -inf where masked (or past the tile), in sc[t] per row.
      [[unroll]] for (uint t = 0u; t < RPT; ++t) sc[t] = vec4(neg_inf());
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        uint c = c0 + j * $CLANE;
        if (c >= cols) break;
$DOTS
        [[unroll]] for (uint t = 0u; t < RPT; ++t)
          if (own(t) < N && kept(own(t), t0 + c)) sc[t][j] = $SCORE;
      }
