// Elementwise operands whose dims do not broadcast must not compile.
// expect: shape_check<qkv::ir::Op::add, qkv::ir::ShapeErr::not_broadcastable, 4, 5>
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto a = input<"a">(dim<3>, dim<4>);
  auto b = input<"b">(dim<5>);
  auto c = a + b;
  (void)c;
}
