// The training loop's one step.
#include "train/trainer.hpp"

#include "ir/passes/passes.hpp"

namespace qkv::train {

Trainer::Trainer(const ir::Graph& forward, const std::string& loss, const std::vector<std::string>& params, const Optimizer& optimizer,
                 backend::Backend& backend, const backend::TensorMap& initial)
    : step_graph_(training_step(ir::build_backward(forward, {loss, params, {}}), params, optimizer)), params_(params), loss_(loss) {
  exe_ = backend.compile(step_graph_);
  backend::TensorMap state = initial_optimizer_state(step_graph_, initial);
  for (const auto& p : params) {
    auto it = initial.find(p);
    if (it == initial.end()) throw ShapeError("trainer: no initial value for parameter '" + p + "'");
    state.emplace(p, it->second);
  }
  exe_->set_state(state);
}

double Trainer::step(const backend::TensorMap& batch) { return exe_->run(batch).at(loss_).at(0); }

backend::TensorMap Trainer::parameters() {
  backend::TensorMap all = exe_->state(), r;
  for (const auto& p : params_) r.emplace(p, all.at(p));
  return r;
}

}  // namespace qkv::train
