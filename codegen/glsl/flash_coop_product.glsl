// $COMMENT
void $NAME(uint sg, uint c) {
  fcoopmatNV<32, gl_ScopeSubgroup, CM, CN> acc = fcoopmatNV<32, gl_ScopeSubgroup, CM, CN>(0.0);
  [[unroll]] for (uint kk = 0u; kk < $D; kk += CK) {
    fcoopmatNV<16, gl_ScopeSubgroup, CM, CK> a;
    fcoopmatNV<16, gl_ScopeSubgroup, CK, CN> b;
    coopMatLoadNV(a, $A, sg * CM * $AS + kk, $AS, false);
    coopMatLoadNV(b, $B, $BAT, $BS, $TR);
    acc = coopMatMulAddNV(a, b, acc);
  }
  coopMatStoreNV(acc, s_s, sg * CM * SS + $AT, SS, false);
}
