  // Each row's sink logit joins its softmax (fold_sink).
  [[unroll]] for (uint t = 0u; t < $ROWS; ++t) {
    if ($ROW >= N) continue;
    float c = fold_sink(sink_logit($ROW), m[t], l[t]);
$O
  }
