// Sink logits [H] for scores of another head count must not compile.
// expect: needs H to be the scores' head count
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto q = input<"q">(dim<"B">, dim<8>, dim<"N">, dim<16>);
  auto s = input<"sinks">(dim<4>);
  auto out = scaled_dot_product_attention(q, q, q, sinks(s));
  (void)out;
}
