// Attention whose q and k head dims differ must not compile.
// expect: shape_check<qkv::ir::Op::matmul, qkv::ir::ShapeErr::inner_dims_differ, 64, 32>
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto q = input<"q">(dim<"B">, dim<"N">, dim<64>);
  auto k = input<"k">(dim<"B">, dim<"M">, dim<32>);
  auto v = input<"v">(dim<"B">, dim<"M">, dim<32>);
  auto out = scaled_dot_product_attention(q, k, v);
  (void)out;
}
