// $COMMENT
void $NAME(uint sg, uint c) {
  uint lane = gl_SubgroupInvocationID;
  for (uint j = 0u; j < EL; ++j) {
    uint e = lane + j * SG, r = sg * CM + e / CN, n = c + e % CN;
    float sum = 0.0;
    for (uint kk = 0u; kk < $D; ++kk) sum = fma(float($A[r * $AS + kk]), float($BEL), sum);
    s_s[r * SS + $AT + e % CN] = sum;
  }
}
