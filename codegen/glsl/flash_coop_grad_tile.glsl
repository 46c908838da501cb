    barrier();
    // dp into registers (each lane its rows' LPR-th columns), then the scores into s_s.
    for (uint c = 0u; c < BC; c += CN) dp_chunk(sg, c);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    float dp[RPL * (BC / LPR)];
    [[unroll]] for (uint i = 0u; i < RPL; ++i)
      [[unroll]] for (uint j = 0u; j < BC / LPR; ++j) dp[i * (BC / LPR) + j] = s_s[(wr0 + i * (SG / LPR)) * SS + sub + j * LPR];
    subgroupMemoryBarrierShared();
    subgroupBarrier();  // read before the scores are stored
    for (uint c = 0u; c < BC; c += CN) score_chunk(sg, c);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    // ds = p (z dp - delta) d mod, p = exp(s - lse): 0 where masked, NaN where dp or delta is.
    // Written in f16 scaled per row by a power of two that brings the row's largest |ds| to
    // [2^13, 2^14) (within f16's range whatever the inputs; its 11 bits relative to that
    // largest), and unscaled exactly as the product is added to the row.
    float unscale[RPL];
    [[unroll]] for (uint i = 0u; i < RPL; ++i) {
      uint wr = wr0 + i * (SG / LPR), $OWN = r0 + wr;
      float ds[BC / LPR];
      float big = 0.0;
      [[unroll]] for (uint j = 0u; j < BC / LPR; ++j) {
        uint c = sub + j * LPR, $OTHER = t0 + c;
        ds[j] = 0.0;
        if (c < cols) {
          float sc = s_s[wr * SS + c] * scale;
$MODIFIED
          float pr = ($OWN < $OWNCOUNT && kept(qi, kj) && sc != neg_inf()) ? exp(sc - $LSE) : 0.0;
          ds[j] = pr * (dp[i * (BC / LPR) + j]$DROP - $DELTA)$DMOD;
        }
        big = qkv_max(big, abs(ds[j]));
      }
$SHUFFLEMAX
      int e = 14;
      if (big > 0.0 && finite(big)) frexp(big, e);  // big = f 2^e, f in [0.5, 1)
      e = clamp(e, -100, 100);
      unscale[i] = ldexp(1.0, e - 14);
      [[unroll]] for (uint j = 0u; j < BC / LPR; ++j) p_s[wr * PS + sub + j * LPR] = float16_t(ldexp(ds[j], 14 - e));
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
$ACCUMULATE
  }
