      // A chunk of four keys' scores and their tangents (0 where masked) in sc[t], dsc[t] per row.
      [[unroll]] for (uint t = 0u; t < RPT; ++t) { sc[t] = vec4(neg_inf()); dsc[t] = vec4(0.0); }
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        uint c = c0 + j;
        if (c >= cols) break;
$DOTS
        [[unroll]] for (uint t = 0u; t < RPT; ++t) {
          if (own(t) >= N || !kept(own(t), t0 + c)) continue;
          float x = sum4(s4[t]) * scale, dx = (sum4(a4[t]) + sum4(b4[t])) * scale;
$MODIFIED
          sc[t][j] = x;
          if (x != neg_inf()) dsc[t][j] = dx;  // a masked score has no tangent
        }
      }
