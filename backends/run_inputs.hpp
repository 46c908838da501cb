// What every executable does with a run's tensors: gather them from the call and from the state
// it holds (no copies), and remember the shapes its plan was made for.
#pragma once

#include <vector>

#include "backends/backend.hpp"
#include "ir/bind.hpp"

namespace qkv::backend {

/// The tensor of each graph input (in `input_ids` order, the graph's inputs) for one run, into
/// `out` (its capacity is reused: no allocation per run): from `inputs`, or from `state` for
/// inputs held on the backend. Throws ShapeError for a missing input, an input the graph does not
/// have, an input given both ways, or an updated input that is not held.
void gather_inputs(const ir::Graph& g, const std::vector<ir::ValueId>& input_ids, const TensorMap& inputs, const TensorMap& state,
                   std::vector<const Tensor*>& out);

/// Inputs whose values an op constrains (dropout_mask's seed lies in [0, 2^24)), checked on every
/// backend before it runs, so none computes with a value the op does not define. Found once per
/// graph; a graph without such inputs checks nothing.
class InputValueChecks {
 public:
  InputValueChecks(const ir::Graph& g, const std::vector<ir::ValueId>& input_ids);
  /// Throws ShapeError naming the input and its value. `tensors` as gather_inputs gives them.
  void check(const std::vector<const Tensor*>& tensors) const {
    for (const auto& [position, name] : seeds_) check_seed(*tensors[position], name);
  }

 private:
  static void check_seed(const Tensor& t, const std::string& name);
  std::vector<std::pair<std::size_t, std::string>> seeds_;  // input position, input name
};

/// Copies of the gathered tensors by name (for binding shapes when planning, which is rare).
TensorMap merged_inputs(const ir::Graph& g, const std::vector<const Tensor*>& tensors);

/// Checks `tensors` are inputs of `g` before they are held as state.
void check_state_names(const ir::Graph& g, const TensorMap& tensors);

/// The input shapes a plan was made for, in the graph's input order.
class InputSignature {
 public:
  /// Whether `tensors` have exactly the recorded shapes and dtypes; cheap, no allocation.
  bool matches(const std::vector<const Tensor*>& tensors) const {
    if (!valid_ || tensors.size() != entries_.size()) return false;
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i]->dtype() != entries_[i].dtype || tensors[i]->shape() != entries_[i].shape) return false;
    return true;
  }
  void record(const std::vector<const Tensor*>& tensors) {
    entries_.clear();
    for (const Tensor* t : tensors) entries_.push_back({t->dtype(), t->shape()});
    valid_ = true;
  }
  void invalidate() { valid_ = false; }

 private:
  struct Entry {
    DType dtype;
    std::vector<std::int64_t> shape;
  };
  bool valid_ = false;
  std::vector<Entry> entries_;
};

}  // namespace qkv::backend
