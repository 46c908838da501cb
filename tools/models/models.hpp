// The built-in models the qkv tool runs, each written in the DSL (models/*.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"

namespace qkv::models {

struct SdpaOptions {
  bool causal = false;
  bool mask = false;     // a boolean input "mask" [B, N, M]; true keeps a key
  double scale = 0.125;  // usually 1/sqrt(D)
};

/// Scaled dot-product attention over q [B, N, D], k [B, M, D], v [B, M, Dv]; outputs "out"
/// [B, N, Dv] and "weights" [B, N, M] (the attention probabilities).
ir::Graph sdpa(const SdpaOptions& options);

/// Names of the built-in models.
std::vector<std::string> model_names();

}  // namespace qkv::models
