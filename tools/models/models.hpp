// The built-in models the qkv tool runs, each written in the DSL (models/*.cpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/tensor.hpp"

namespace qkv::models {

struct SdpaOptions {
  bool causal = false;
  bool mask = false;     // a boolean input "mask" [B, N, M]; true keeps a key
  double scale = 0.125;  // usually 1/sqrt(D)
};

/// Scaled dot-product attention over q [B, N, D], k [B, M, D], v [B, M, Dv]; outputs "out"
/// [B, N, Dv] and "weights" [B, N, M] (the attention probabilities).
ir::Graph sdpa(const SdpaOptions& options);

/// The copy task: L random symbols, a separator, the same L symbols again; each position predicts
/// the next token, and only the copy can be predicted (other targets are -1, ignored).
struct CopyTask {
  static constexpr std::int64_t symbols = 8, separator = 8, vocab = 10, length = 5, seq = 2 * length + 1, dim = 32;
};

/// A tiny causal transformer for the copy task: token embeddings (one_hot @ embed) plus learned
/// positions, one causal attention layer with a residual connection, a linear head, and the
/// cross-entropy loss (output "loss"). Inputs: tokens and targets i32 [B, seq]; parameters
/// copy_task_params().
ir::Graph copy_task_model();
std::vector<std::string> copy_task_params();
/// A batch of copy-task sequences from a seed: "tokens" and "targets".
std::map<std::string, Tensor, std::less<>> copy_task_batch(std::int64_t batch, std::uint64_t seed);
/// The loss of guessing uniformly among the symbols at the scored positions.
double copy_task_chance_loss();

/// Names of the built-in models.
std::vector<std::string> model_names();

}  // namespace qkv::models
