// Splitting an embedding into a number of heads that does not divide it must not compile.
// expect: not divisible by the number of heads
#include "dsl/dsl.hpp"
int main() {
  using namespace qkv;
  auto x = input<"x">(dim<"B">, dim<"T">, dim<30>);
  auto h = split_heads<4>(x);
  (void)h;
}
