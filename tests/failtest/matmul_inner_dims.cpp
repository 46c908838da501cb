// A matmul whose inner dims differ must not compile, and must say which op, error and dims.
// expect: shape_check<qkv::ir::Op::matmul, qkv::ir::ShapeErr::inner_dims_differ, 64, 8>
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto a = input<"a">(dim<"N">, dim<64>);
  auto b = input<"b">(dim<8>, dim<"M">);
  auto c = matmul(a, b);
  (void)c;
}
