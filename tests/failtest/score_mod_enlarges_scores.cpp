// A score_mod whose result does not broadcast to the scores (it adds a dim) must not compile.
// expect: a score_mod's result must broadcast to the scores' shape
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto q = input<"q">(dim<"B">, dim<2>, dim<"N">, dim<16>);
  auto extra = input<"extra">(dim<3>, dim<1>, dim<1>, dim<1>, dim<1>);
  auto out = scaled_dot_product_attention(q, q, q, score_mod([=](auto s, auto, auto, auto, auto) { return s + extra; }));
  (void)out;
}
