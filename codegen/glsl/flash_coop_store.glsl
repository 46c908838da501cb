$NOTE
  [[unroll]] for (uint i = 0u; i < RPL; ++i) {
    uint $OWN = r0 + wr0 + i * (SG / LPR);
    if ($OWN >= $OWNCOUNT) continue;
    [[unroll]] for (uint x = 0u; x < KV / LPR; ++x) {
      uint col = x / (CN / LPR) * CN + sub + x % (CN / LPR) * LPR;
      float y = o[i * (KV / LPR) + x];
      if (col < DVR) OUT[out_at + $OWN * out_rs + col] = $STORED;
    }
  }
