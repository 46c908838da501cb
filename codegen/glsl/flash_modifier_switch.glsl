bool tile_unmasked = false;  // set per tile by tile_masked
$TYPE $FN(float score, uint q_idx, uint kv_idx) {
  return tile_unmasked ? ${FN}_kept(score, q_idx, kv_idx) : ${FN}_masked(score, q_idx, kv_idx);
}
