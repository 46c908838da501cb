// An f16 tensor plus an f32 tensor must not compile (cast one first); a scalar would be fine.
// expect: shape_check<qkv::ir::Op::add, qkv::ir::ShapeErr::dtypes_differ
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto a = input<"a", DType::f16>(dim<3>);
  auto b = input<"b">(dim<3>);
  auto ok = a * 0.5;  // a rank-0 constant takes a's dtype
  auto c = ok + b;
  (void)c;
}
