  [[unroll]] for (uint i = 0u; i < RPL; ++i) {
    uint own_row = r0 + wr0 + i * (SG / LPR);
    if (own_row >= $OWNCOUNT) continue;
    [[unroll]] for (uint x = 0u; x < KD / LPR; ++x) {
      uint col = x / (CN / LPR) * CN + sub + x % (CN / LPR) * LPR;
      float y = o[i * (KD / LPR) + x] * scale;
      if (col < DR) OUT[out_at + own_row * out_rs + col] = $STORED;
    }
  }
