// Training a model on a backend: parameters and optimizer state stay on the backend; each step
// uploads one batch and reads back one number.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "train/optimizer.hpp"

namespace qkv::train {

class Trainer {
 public:
  /// `forward` has a scalar output `loss`; `params` name the inputs to train (the others are
  /// data, given to each step); `initial` holds their starting values.
  Trainer(const ir::Graph& forward, const std::string& loss, const std::vector<std::string>& params, const Optimizer& optimizer,
          backend::Backend& backend, const backend::TensorMap& initial);

  /// One step on a batch: the loss before the update, then the update, on the backend.
  double step(const backend::TensorMap& batch);
  /// The current parameter values (copied from the backend).
  backend::TensorMap parameters();
  /// The step graph: forward, backward and optimizer updates.
  const ir::Graph& graph() const { return step_graph_; }
  /// The step graph as the backend runs it (fused and lowered for it).
  const ir::Graph& compiled_graph() const { return exe_->graph(); }
  /// Memory the backend planned for one step (activations kept for the backward included).
  std::int64_t planned_bytes() const { return exe_->planned_bytes(); }

 private:
  ir::Graph step_graph_;
  std::vector<std::string> params_;
  std::string loss_;
  std::unique_ptr<backend::Executable> exe_;
};

}  // namespace qkv::train
