// Emulated fragments: invocation `lane` of the subgroup owns elements lane + j SG of each.
const uint EL = CM * CN / SG;
float acc[FM * FN * EL];
void zero() { [[unroll]] for (uint i = 0u; i < FM * FN * EL; ++i) acc[i] = 0.0; }
void multiply(uint kk) {
  uint lane = gl_SubgroupInvocationID;
  for (uint f = 0u; f < FM * FN; ++f)
    for (uint j = 0u; j < EL; ++j) {
      uint e = lane + j * SG, r = r0 + (f / FN) * CM + e / CN, c = c0 + (f % FN) * CN + e % CN;
      float sum = acc[f * EL + j];
      for (uint q = 0u; q < CK; ++q) sum = fma(float(As[r * AS + kk + q]), float(Bs[(kk + q) * BS + c]), sum);
      acc[f * EL + j] = sum;
    }
}
void keep() {
  uint lane = gl_SubgroupInvocationID;
  for (uint f = 0u; f < FM * FN; ++f)
    for (uint j = 0u; j < EL; ++j) {
      uint e = lane + j * SG;
      Cs[(r0 + (f / FN) * CM + e / CN) * CS + c0 + (f % FN) * CN + e % CN] = acc[f * EL + j];
    }
}

