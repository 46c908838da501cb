// A mask_mod that returns a float (a score, not a keep-mask) must not compile.
// expect: a mask_mod returns a boolean expression
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto q = input<"q">(dim<"B">, dim<2>, dim<"N">, dim<16>);
  auto out = scaled_dot_product_attention(q, q, q, mask_mod([](auto, auto, auto i, auto j) { return j - i; }));
  (void)out;
}
