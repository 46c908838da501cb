    // The online softmax, each lane over LPR-th of its rows' scores: the running max moves, and the
    // sum and output are rescaled, only when the tile raises it.
    [[unroll]] for (uint i = 0u; i < RPL; ++i) {
      uint wr = wr0 + i * (SG / LPR), qi = r0 + wr;
      float sc[BC / LPR];
      float mx = neg_inf();
      [[unroll]] for (uint j = 0u; j < BC / LPR; ++j) {
        uint c = sub + j * LPR, kj = t0 + c;
        sc[j] = neg_inf();
        if (c < cols && qi < N && kept(qi, kj)) sc[j] = $SCORE;
        mx = qkv_max(mx, sc[j]);
      }
$SHUFFLEMAX
      float m_new = qkv_max(m[i], mx);
      if (m_new != m[i]) {  // also NaN, which then reaches l and o as in the decomposition
        float alpha = exp(m[i] - (m_new == neg_inf() ? 0.0 : m_new));
        l[i] *= alpha;
$ORESCALE
        m[i] = m_new;
      }
      float base = m[i] == neg_inf() ? 0.0 : m[i];  // no key yet: every exp is 0
      [[unroll]] for (uint j = 0u; j < BC / LPR; ++j) {
        uint c = sub + j * LPR;
        float p = exp(sc[j] - base);
        l[i] += p;
$PWRITE
      }
    }
