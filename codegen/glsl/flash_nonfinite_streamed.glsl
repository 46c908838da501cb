  for (uint x = lid; x < ($END - $FIRST - gap) * $W; x += INV) {
    uint j = $FIRST + x / $W;
    j = j < lo ? j : j + gap;
    if (!finite(load_$A($AT + j * $RS + x % $W))) atomicOr(nonfinite[0], 1u);
  }
