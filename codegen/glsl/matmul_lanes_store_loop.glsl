  // The accumulators stored in a loop, the epilogue called once (see lanes_stores).
  float acc[$COUNT] = float[]($ACCUMULATORS);
  uint cbs[$COLS] = uint[]($COLUMNS);
  bool kbs[$COLS] = bool[]($KEPT);
  for (uint r = 0u; r < $ROWSu; ++r) {
    if (r / $SGu >= RG || r0 + r >= M) continue;
    for (uint j = 0u; j < $COLSu; ++j)
      if (kbs[j]) st(oy + (r0 + r) * N + cbs[j], qkv_epilogue(acc[r * $COLSu + j], r0 + r, cbs[j]));
  }
