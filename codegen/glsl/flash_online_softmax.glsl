    // Four keys at a time, their scores in a vec4 per row (registers: an array of a tile's
    // scores would live in local memory on a GPU). The running max moves, and the sum and
    // accumulator are rescaled, only when a chunk raises it. Decoding, each invocation takes
    // keys of its own: c0 + j * $CLANE.
    for (uint c0 = $CFIRST; c0 < cols; c0 += $CSTEP) {
      vec4 sc[RPT];  // the chunk's scores, then exp(score - m)
$SCORES
      [[unroll]] for (uint t = 0u; t < RPT; ++t) {
        float m_new = qkv_max(m[t], qkv_max(qkv_max(sc[t].x, sc[t].y), qkv_max(sc[t].z, sc[t].w)));
        if (m_new != m[t]) {  // also NaN, which then reaches l and o as in the decomposition
          float alpha = exp(m[t] - (m_new == neg_inf() ? 0.0 : m_new));
          l[t] *= alpha;
$RESCALE
          m[t] = m_new;
        }
        sc[t] = exp(sc[t] - vec4(m[t] == neg_inf() ? 0.0 : m[t]));  // no key yet: every exp is 0
        l[t] += sum4(sc[t]);
$DROP
      }
$ACCUMULATE
    }
