// Caches what an executable planned for one set of input shapes, so that repeated runs with the
// same shapes skip binding and planning.
#pragma once

#include <optional>
#include <vector>

#include "backends/backend.hpp"
#include "ir/bind.hpp"

namespace qkv::backend {

/// The input shapes a plan was made for, in the graph's input order.
class InputSignature {
 public:
  /// Whether `inputs` have exactly the shapes and dtypes recorded; cheap, no allocation.
  bool matches(const ir::Graph& g, const TensorMap& inputs) const {
    if (!valid_ || inputs.size() != entries_.size()) return false;
    std::size_t i = 0;
    for (ir::ValueId v : input_ids_) {
      auto it = inputs.find(g.node(v).name);
      if (it == inputs.end() || it->second.dtype() != entries_[i].dtype || it->second.shape() != entries_[i].shape) return false;
      ++i;
    }
    return true;
  }
  void record(const ir::Graph& g, const TensorMap& inputs) {
    input_ids_ = g.inputs();
    entries_.clear();
    for (ir::ValueId v : input_ids_) {
      const Tensor& t = inputs.find(g.node(v).name)->second;
      entries_.push_back({t.dtype(), t.shape()});
    }
    valid_ = true;
  }

 private:
  struct Entry {
    DType dtype;
    std::vector<std::int64_t> shape;
  };
  bool valid_ = false;
  std::vector<ir::ValueId> input_ids_;
  std::vector<Entry> entries_;
};

}  // namespace qkv::backend
