  [[unroll]] for (uint t = 0u; t < RPT; ++t) {
    if (own(t) >= $COUNT) continue;
    [[unroll]] for (uint g = 0u; g < $G; ++g)
      [[unroll]] for (uint e = 0u; e < 4u; ++e)
        if (4u * g + e < $W) $OUT[out_at + own(t) * out_rs + 4u * g + e] = $STORED;
  }
