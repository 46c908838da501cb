// Gathering a run's tensors from the call and from held state.
#include "backends/run_inputs.hpp"

#include "ir/printer.hpp"

#include <algorithm>

#include "ir/random.hpp"

namespace qkv::backend {

void gather_inputs(const ir::Graph& g, const std::vector<ir::ValueId>& input_ids, const TensorMap& inputs, const TensorMap& state,
                   std::vector<const Tensor*>& r) {
  r.clear();
  std::size_t used = 0;
  for (ir::ValueId v : input_ids) {
    const std::string& name = g.node(v).name;
    auto given = inputs.find(name);
    auto held = state.find(name);
    if (given != inputs.end() && held != state.end())
      throw ShapeError("input '" + name + "' is held on the backend as state; do not also pass it to run");
    if (given != inputs.end()) {
      r.push_back(&given->second);
      ++used;
    } else if (held != state.end()) {
      r.push_back(&held->second);
    } else {
      throw ShapeError("missing input '" + name + "' (" + g.type_string(v) + ")");
    }
  }
  if (used != inputs.size())
    for (const auto& [name, t] : inputs) {
      bool known = false;
      for (ir::ValueId v : g.inputs()) known = known || g.node(v).name == name;
      if (!known) throw ShapeError("graph has no input '" + name + "'");
    }
  for (const auto& [name, v] : g.updates())
    if (!state.contains(name)) throw ShapeError("input '" + name + "' is updated by the graph, so it must be held on the backend (set_state)");
}

InputValueChecks::InputValueChecks(const ir::Graph& g, const std::vector<ir::ValueId>& input_ids) {
  for (const ir::Node& n : g.nodes()) {
    // dropout_mask's seed, and fused attention's (its last operand) when it drops weights.
    ir::ValueId seed = -1;
    if (n.op == ir::Op::dropout_mask) seed = n.inputs[1];
    else if (ir::has_dropout_seed(n.op, n.attrs)) seed = n.inputs.back();
    else continue;
    for (std::size_t i = 0; i < input_ids.size(); ++i)
      if (input_ids[i] == seed && std::find_if(seeds_.begin(), seeds_.end(), [&](const auto& s) { return s.first == i; }) == seeds_.end())
        seeds_.emplace_back(i, g.node(input_ids[i]).name);
  }
}

void InputValueChecks::check_seed(const Tensor& t, const std::string& name) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (!ir::dropout_seed_ok(t.at(i))) throw ShapeError("input '" + name + "': dropout seed " + ir::format_number(t.at(i)) + " is outside [0, 2^24)");
}

TensorMap merged_inputs(const ir::Graph& g, const std::vector<const Tensor*>& tensors) {
  TensorMap m;
  std::size_t i = 0;
  for (ir::ValueId v : g.inputs()) m.emplace(g.node(v).name, *tensors[i++]);
  return m;
}

void check_state_names(const ir::Graph& g, const TensorMap& tensors) {
  for (const auto& [name, t] : tensors) {
    bool found = false;
    for (ir::ValueId v : g.inputs())
      if (g.node(v).name == name) {
        found = true;
        if (t.dtype() != g.node(v).dtype) throw ShapeError("state '" + name + "': expected " + g.type_string(v) + ", got " + t.type_string());
      }
    if (!found) throw ShapeError("state '" + name + "': the graph has no such input");
  }
}

}  // namespace qkv::backend
