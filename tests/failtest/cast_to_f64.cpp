// Graph values are never f64 (the reference computes in double inside its kernels).
// expect: shape_check<qkv::ir::Op::cast, qkv::ir::ShapeErr::not_castable
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto a = input<"a", DType::f16>(dim<3>);
  auto c = cast<DType::f64>(a);
  (void)c;
}
