// Optimizers as graph updates: a training step is one graph that computes the loss, the
// gradients and the new parameters and optimizer state, all on the backend.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "backends/backend.hpp"

namespace qkv::train {

/// PyTorch's SGD: g += weight_decay * p; v = momentum * v + g (when momentum > 0); p -= lr * v.
struct Sgd {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
};

/// PyTorch's AdamW: p *= 1 - lr * weight_decay; m, v moving averages of g and g^2; p -= lr *
/// m_hat / (sqrt(v_hat) + eps) with bias corrections from the step count, all in the graph.
struct AdamW {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

using Optimizer = std::variant<Sgd, AdamW>;

/// The training step graph: `backward` (with outputs "d_<p>" for each parameter p) plus updates
/// of every parameter and of the optimizer's own state inputs: "<p>.momentum" for SGD with
/// momentum; "<p>.m", "<p>.v" and the scalar "adamw.step" for AdamW. Its outputs are
/// `backward`'s outputs other than the gradients (the gradients feed the updates on the backend).
ir::Graph training_step(const ir::Graph& backward, const std::vector<std::string>& params, const Optimizer& optimizer);

/// Zero tensors for every input of `step` that the optimizer added (held on the backend with the
/// parameters).
backend::TensorMap initial_optimizer_state(const ir::Graph& step, const backend::TensorMap& params);

}  // namespace qkv::train
