// What the examples share: the backend named on the command line, and printing matrices.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "backends/backend.hpp"

namespace qkv::example {

/// The backend named by argv[1] (or QKV_BACKEND, or cpu). One that cannot start exits 77, which
/// ctest reports as skipped (CI, with QKV_REQUIRE_VULKAN=1, counts it as a failure).
inline std::unique_ptr<backend::Backend> open_backend(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : backend::default_backend_name();
  try {
    auto be = backend::create(name);
    std::printf("backend: %s (%s)\n\n", be->name().c_str(), be->device().c_str());
    return be;
  } catch (const BackendError& e) {
    std::fprintf(stderr, "backend %s cannot start, skipped: %s\n", name.c_str(), e.what());
    std::exit(77);
  }
}

/// Prints matrix `index` of a tensor [..., rows, cols].
inline void print_matrix(const char* title, const Tensor& t, std::int64_t index = 0) {
  const std::int64_t rows = t.rank() >= 2 ? t.shape().end()[-2] : 1, cols = t.shape().back();
  std::printf("%s\n", title);
  for (std::int64_t i = 0; i < rows; ++i) {
    std::printf("  ");
    for (std::int64_t j = 0; j < cols; ++j) std::printf("%8.4f", t.at((index * rows + i) * cols + j));
    std::printf("\n");
  }
}

/// "Your journey starts with one step" as 3-d embeddings (Raschka, ch. 3).
inline Tensor journey() {
  return Tensor::from<float>(
      {6, 3}, {0.43f, 0.15f, 0.89f, 0.55f, 0.87f, 0.66f, 0.57f, 0.85f, 0.64f, 0.22f, 0.58f, 0.33f, 0.77f, 0.25f, 0.10f, 0.05f, 0.80f, 0.55f});
}

}  // namespace qkv::example
