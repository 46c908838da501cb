    // $WHAT, CN columns at a time through s_s (the scores are read).
    [[unroll]] for (uint c = 0u; c < $W / CN; ++c) {
      pv_chunk(sg, c * CN);
      subgroupMemoryBarrierShared();
      subgroupBarrier();
      [[unroll]] for (uint i = 0u; i < RPL; ++i)
        [[unroll]] for (uint j = 0u; j < CN / LPR; ++j)
          o[i * ($W / LPR) + c * (CN / LPR) + j] += s_s[(wr0 + i * (SG / LPR)) * SS + sub + j * LPR]$FACTOR;
      subgroupMemoryBarrierShared();
      subgroupBarrier();  // read before the next product is stored
    }
