    // p = exp(s - lse), each lane over LPR-th of its rows' scores; 0 where masked.
    [[unroll]] for (uint i = 0u; i < RPL; ++i) {
      uint wr = wr0 + i * (SG / LPR), kj = r0 + wr;
      [[unroll]] for (uint j = 0u; j < BC / LPR; ++j) {
        uint c = sub + j * LPR, qi = t0 + c;
        float p = 0.0;
        if (c < cols && kj < M && kept(qi, kj)) {
          float sc = $SCORE;
          if (sc != neg_inf()) p = exp(sc - lse_s[c]);
        }
$DROP
        p_s[wr * PS + c] = float16_t(p);
      }
    }
