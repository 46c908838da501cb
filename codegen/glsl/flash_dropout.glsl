
// Dropout (p = $P): dropout_mask's factor for weight (i, j) of this batch entry.
$PHILOX
const uint DROP_THRESHOLD = $THRESHOLD;
float dropout_factor(uint i, uint j) {
  float keep = uintBitsToFloat($KEEP);  // 1 / (1 - p)
  return qkv_philox((batch_index * N + i) * M + j, drop_seed) >= DROP_THRESHOLD ? keep : 0.0;
}
