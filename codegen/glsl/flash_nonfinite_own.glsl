  [[unroll]] for (uint t = 0u; t < RPT; ++t) {
    uint at;
    if ($ANY && own(t) < $OWNCOUNT && row_at_$A(own(t), at))
      for (uint d = 0u; d < $W; ++d)
        if (!finite(load_$A(at + d))) atomicOr(nonfinite[0], 1u);
  }
