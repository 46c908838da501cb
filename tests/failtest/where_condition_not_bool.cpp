// where() with a float condition must not compile.
// expect: shape_check<qkv::ir::Op::where, qkv::ir::ShapeErr::not_bool
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto a = input<"a">(dim<3>);
  auto c = where(a, a, 0.0);
  (void)c;
}
