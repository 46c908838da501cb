fcoopmatNV<32, gl_ScopeSubgroup, CM, CN> acc[FM * FN];
void zero() { [[unroll]] for (uint f = 0u; f < FM * FN; ++f) acc[f] = fcoopmatNV<32, gl_ScopeSubgroup, CM, CN>(0.0); }
// acc += A's rows r0.. x B's columns c0.., depth kk..kk + CK of the staged tiles.
void multiply(uint kk) {
  fcoopmatNV<16, gl_ScopeSubgroup, CM, CK> a[FM];
  [[unroll]] for (uint fm = 0u; fm < FM; ++fm) coopMatLoadNV(a[fm], As, (r0 + fm * CM) * AS + kk, AS, false);
  [[unroll]] for (uint fn = 0u; fn < FN; ++fn) {
    fcoopmatNV<16, gl_ScopeSubgroup, CK, CN> b;
    coopMatLoadNV(b, Bs, kk * BS + c0 + fn * CN, BS, false);
    [[unroll]] for (uint fm = 0u; fm < FM; ++fm) acc[fm * FN + fn] = coopMatMulAddNV(a[fm], b, acc[fm * FN + fn]);
  }
}
void keep() {
  [[unroll]] for (uint fm = 0u; fm < FM; ++fm)
    [[unroll]] for (uint fn = 0u; fn < FN; ++fn) coopMatStoreNV(acc[fm * FN + fn], Cs, (r0 + fm * CM) * CS + c0 + fn * CN, CS, false);
}

