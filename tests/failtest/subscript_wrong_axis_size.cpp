// Per-head slopes of the wrong length, subscripted by the head index, must not compile.
// expect: give the indices in the scores' order \(b, h, q_idx, kv_idx\), each dim of x that axis' size
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto q = input<"q">(dim<"B">, dim<2>, dim<"N">, dim<16>);
  auto slope = input<"slope">(dim<3>);
  auto out = scaled_dot_product_attention(q, q, q, score_mod([=](auto s, auto, auto h, auto, auto) { return s + slope[h]; }));
  (void)out;
}
