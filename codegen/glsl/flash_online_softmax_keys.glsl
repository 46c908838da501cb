    // Four keys at a time, their scores in a vec4 per row (registers: an array of a tile's
    // scores would live in local memory on a GPU); then key by key, in order, the running max
    // moves (the sum and the accumulator rescaled only when a key raises it) and the key's weight
    // joins the sum and the accumulator. No tile or chunk boundary changes a row's sums (a masked
    // key adds exact zeros where its value is finite), so a sequence of a packed batch gets the
    // bits it gets alone.
    // Decoding, each invocation takes keys of its own: c0 + j * $CLANE.
    for (uint c0 = $CFIRST; c0 < cols; c0 += $CSTEP) {
      vec4 sc[RPT];  // the chunk's scores
$SCORES
      [[unroll]] for (uint j = 0u; j < 4u; ++j) {
        uint c = c0 + j * $CLANE;
        if (c >= cols) break;
        float p[RPT];  // the key's weight exp(score - m) per row
        [[unroll]] for (uint t = 0u; t < RPT; ++t) {
          float m_new = qkv_max(m[t], sc[t][j]);
          if (m_new != m[t]) {  // also NaN, which then reaches l and o as in the decomposition
            float alpha = exp(m[t] - (m_new == neg_inf() ? 0.0 : m_new));
            l[t] *= alpha;
$RESCALE
            m[t] = m_new;
          }
          p[t] = exp(sc[t][j] - (m[t] == neg_inf() ? 0.0 : m[t]));  // no key yet: 0
          l[t] += p[t];
$DROP
        }
$ACCUMULATE
      }
    }
