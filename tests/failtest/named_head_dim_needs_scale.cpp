// The default scale 1/sqrt(d) needs a static head dim.
// expect: head dim of q is named
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto q = input<"q">(dim<"N">, dim<"D">);
  auto out = scaled_dot_product_attention(q, q, q);
  (void)out;
}
