// Uses installed qkv headers and libraries: causal attention on the cpu backend.
#include <cmath>
#include <cstdio>

#include "backends/backend.hpp"
#include "dsl/dsl.hpp"

int main() {
  using namespace qkv;
  auto q = input<"q">(dim<"N">, dim<2>);
  auto out = backend::create("cpu")->compile(lower(attention_weights(q, q, causal, scale(1.0))))->run(
      {{"q", Tensor::from<float>({2, 2}, {1, 0, 0, 1})}});
  const double w = out.at("out").at(2);  // query 1 over keys 0 and 1: e^0 / (e^0 + e^1)
  std::printf("consumer: weight %.6f\n", w);
  return std::abs(w - 1.0 / (1.0 + std::exp(1.0))) < 1e-6 ? 0 : 1;
}
