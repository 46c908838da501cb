  [[unroll]] for (uint t = 0u; t < RPT; ++t)
    if ($ANY && own(t) < $OWNCOUNT)
      for (uint d = 0u; d < $W; ++d)
        if (!finite(load_$A($AT + own(t) * $RS + d))) atomicOr(nonfinite[0], 1u);
