// Scaled dot-product attention in the qkv DSL, step by step, on the backend named on the command
// line (or QKV_BACKEND, or cpu): six tokens of "Your journey starts with one step" as 3-d
// embeddings attend to each other, first freely, then causally.
#include <cstdio>
#include <string>

#include "backends/backend.hpp"
#include "dsl/dsl.hpp"
#include "ir/printer.hpp"

namespace {

void print_matrix(const char* title, const qkv::Tensor& t) {
  std::printf("%s %s\n", title, t.type_string().c_str());
  auto rows = t.shape()[0], cols = t.shape()[1];
  for (std::int64_t i = 0; i < rows; ++i) {
    std::printf("  ");
    for (std::int64_t j = 0; j < cols; ++j) std::printf("%8.4f", t.at(i * cols + j));
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace qkv;
  const std::string backend_name = argc > 1 ? argv[1] : backend::default_backend_name();

  // The model: the same tokens serve as queries, keys and values (self-attention without weights).
  auto x = input<"x">(dim<"N">, dim<3>);
  auto weights = attention_weights(x, x);
  auto causal_weights = attention_weights(x, x, causal);
  ir::Graph graph = lower(named<"weights">(weights), named<"context">(matmul(weights, x)),
                          named<"causal_weights">(causal_weights), named<"causal_context">(matmul(causal_weights, x)));
  std::printf("The lowered IR:\n%s\n", ir::print(graph).c_str());

  auto tokens = Tensor::from<float>({6, 3}, {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f,
                                             0.22f, 0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f});
  std::unique_ptr<backend::Backend> be;
  try {
    be = backend::create(backend_name);
  } catch (const BackendError& e) {
    std::fprintf(stderr, "sdpa_basics: backend %s cannot start, skipped: %s\n", backend_name.c_str(), e.what());
    return 77;  // ctest reports SKIPPED (unless QKV_REQUIRE_VULKAN=1, where it fails)
  }
  try {
    std::printf("Running on %s (%s)\n\n", be->name().c_str(), be->device().c_str());
    auto out = be->compile(graph)->run({{"x", tokens}});
    print_matrix("Attention weights softmax(x xT / sqrt(3)), one row per query:", out.at("weights"));
    print_matrix("Context vectors (weights @ x):", out.at("context"));
    print_matrix("Causal weights (zeros above the diagonal):", out.at("causal_weights"));
    print_matrix("Causal context vectors:", out.at("causal_context"));
  } catch (const Error& e) {
    std::fprintf(stderr, "sdpa_basics: %s\n", e.what());
    return 1;
  }
  return 0;
}
