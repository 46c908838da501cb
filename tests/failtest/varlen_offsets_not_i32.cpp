// Packed-sequence offsets that are not i32 [S + 1] must not compile.
// expect: varlen takes i32 offsets
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto q = input<"q">(dim<8>, dim<"N">, dim<16>);
  auto cu = input<"cu">(dim<"S1">);
  auto out = scaled_dot_product_attention(q, q, q, varlen(cu), causal);
  (void)out;
}
