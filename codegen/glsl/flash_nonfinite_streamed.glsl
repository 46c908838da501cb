  for (uint x = lid; x < ($OTHERCOUNT - gap) * $W; x += INV) {
    uint j = x / $W;
    j = j < lo ? j : j + gap;
    if (!finite(load_$A($AT + j * $RS + x % $W))) atomicOr(nonfinite[0], 1u);
  }
