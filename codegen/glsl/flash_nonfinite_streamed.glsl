  for (uint x = lid; x < ($END - $FIRST - gap) * $W; x += INV) {
    uint j = $FIRST + x / $W, at;
    j = j < lo ? j : j + gap;
    if (row_at_$A(j, at) && !finite(load_$A(at + x % $W))) atomicOr(nonfinite[0], 1u);
  }
