    // Four keys at a time: their scores s and the scores' tangents s' = (tq . k + q . tk) scale
    // (times d mod / d score under a modifier; 0 where masked) in vec4s per row. Beside the online
    // softmax's max m and sum l, three running sums rescaled with the max: o = sum e z v,
    // tt = sum e z (s' v + tv) and mu = sum e s', e = exp(s - m), z dropout's factor.
    for (uint c0 = 0u; c0 < cols; c0 += 4u) {
      vec4 sc[RPT], dsc[RPT];  // the chunk's scores and tangents, then exp(score - m)
$SCORES
      [[unroll]] for (uint t = 0u; t < RPT; ++t) {
        float m_new = qkv_max(m[t], qkv_max(qkv_max(sc[t].x, sc[t].y), qkv_max(sc[t].z, sc[t].w)));
$MOVE
        sc[t] = exp(sc[t] - vec4(m[t] == neg_inf() ? 0.0 : m[t]));  // no key yet: every exp is 0
        l[t] += sum4(sc[t]);
        mu[t] += sum4(sc[t] * dsc[t]);
$DROP
      }
      // o += e z v, tt += e z (s' v + tv) over the chunk's keys.
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        uint c = c0 + j;
        if (c >= cols) break;
        [[unroll]] for (uint g = 0u; g < DV4; ++g) {
          vec4 x = v_tile[c * DV4 + g], tx = tv_tile[c * DV4 + g];
          [[unroll]] for (uint t = 0u; t < RPT; ++t) {
            o[t * DV4 + g] += sc[t][j] * x;
            tt[t * DV4 + g] += sc[t][j] * (dsc[t][j] * x + tx);
          }
        }
      }
    }
