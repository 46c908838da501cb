// ir::Graph: values in topological order, named inputs and outputs, symbolic dims.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/op.hpp"
#include "ir/op_rules.hpp"

namespace qkv::ir {

/// A value of a graph: the index of the node that defines it.
using ValueId = std::int32_t;

class Graph;

/// A derived dim: `a op b`.
struct DerivedDim {
  DimOp op = DimOp::sum;  ///< how a and b combine: sum, product or quotient
  Dim a = 0;              ///< the left dim
  Dim b = 0;              ///< the right dim
};

/// One node: an op applied to earlier values. Each node defines one value.
struct Node {
  Op op = Op::input;            ///< the op applied
  std::vector<ValueId> inputs;  ///< its operands, values defined earlier
  Attrs attrs;                  ///< its attributes (the fields its op reads; the others default)
  DType dtype = DType::f32;     ///< the value's dtype
  Shape shape;                  ///< the value's shape
  std::string name;             ///< inputs: the input's name; otherwise empty
  /// Flex attention ops: the score modifier (ir/region.hpp), shared and never changed; null for
  /// every other op.
  std::shared_ptr<const Graph> region;
};

/// A dataflow graph in SSA form. Nodes are appended in topological order; `add` infers shape
/// and dtype with the registry's rules (throwing ShapeError) and shares structurally equal
/// nodes, so building a graph never creates a common subexpression twice.
class Graph {
 public:
  /// Declares a named dim and returns its symbol.
  Dim symbol(std::string_view name);
  /// Declares every symbol of `other` here, derived ones included (what passes that copy graphs do).
  void copy_symbols(const Graph& other);
  /// The dim `a op b` (see derived_dim), its name ("A+B", "3*E", "E/H") and parts recorded when
  /// it is a symbol.
  Dim derive_dim(DimOp op, Dim a, Dim b);
  /// The dim `a + b` (derive_dim with DimOp::sum).
  Dim sum_dim(Dim a, Dim b) { return derive_dim(DimOp::sum, a, b); }
  /// Adds a named input; adding the same name again with the same type returns the same value.
  ValueId add_input(std::string_view name, DType dtype, const Shape& shape);
  /// Adds a node, or returns an existing equal one. Flex attention ops take their score
  /// modifier as `region` (checked against their tensor operands); other ops take none.
  ValueId add(Op op, std::vector<ValueId> inputs, Attrs attrs = {}, std::shared_ptr<const Graph> region = nullptr);
  /// A constant; with `rsqrt_of` (a dim), value / sqrt(that dim's size) once bound.
  ValueId constant(double value, const Shape& shape = {}, Dim rsqrt_of = 0);
  /// `v` as `dtype`: a cast node, or `v` itself when it already is of that dtype.
  ValueId cast(ValueId v, DType dtype);
  /// A node like `n` (from another graph) with operands `inputs` of this graph: add_input for
  /// inputs, add otherwise. What passes that copy graphs use.
  ValueId add_like(const Node& n, std::vector<ValueId> inputs);
  /// Names `value` as an output; names are unique.
  void set_output(std::string_view name, ValueId value);
  /// After each run, input `input` takes `value` (same dtype and shape): how a training step
  /// writes back parameters and optimizer state that the backend holds between runs.
  void set_update(std::string_view input, ValueId value);

  /// Every node, in topological order; a value's id is its index.
  const std::deque<Node>& nodes() const { return nodes_; }
  /// The node defining `v`; references stay valid while nodes are added (deque storage).
  const Node& node(ValueId v) const { return nodes_.at(static_cast<std::size_t>(v)); }
  /// The number of nodes.
  std::size_t size() const { return nodes_.size(); }
  /// Input values in the order they were added.
  std::vector<ValueId> inputs() const;
  /// The named outputs, in the order they were set.
  const std::vector<std::pair<std::string, ValueId>>& outputs() const { return outputs_; }
  /// The value of output `name`; throws IrError naming it when there is none.
  ValueId output(std::string_view name) const;
  /// The updates (input name, new value), in the order they were set.
  const std::vector<std::pair<std::string, ValueId>>& updates() const { return updates_; }
  /// Output values and update values: what a run must compute and keep to its end.
  std::vector<ValueId> result_values() const;
  /// Copies `src`'s outputs and updates into this graph through `map` (src value -> value here).
  void copy_results(const Graph& src, const std::vector<ValueId>& map);
  /// Forgets the outputs and updates (a pass that names others).
  void clear_results() {
    outputs_.clear();
    updates_.clear();
  }
  /// Every declared symbol and its name.
  const std::map<Dim, std::string>& symbols() const { return symbols_; }
  /// Derived symbols and how each is made of two dims.
  const std::map<Dim, DerivedDim>& derived_dims() const { return derived_; }

  /// "N" for a symbol, "64" for a size.
  std::string dim_name(Dim d) const;
  /// "f32[B,N,64]".
  std::string type_string(DType dtype, const Shape& shape) const;
  /// The type of value `v`, as "f32[B,N,64]".
  std::string type_string(ValueId v) const { return type_string(node(v).dtype, node(v).shape); }

  /// Appends a node without inference or sharing; the verifier checks it. For parsers and passes.
  ValueId append_unchecked(Node n);

 private:
  std::deque<Node> nodes_;  // a deque: adding nodes never moves existing ones
  std::vector<std::pair<std::string, ValueId>> outputs_;
  std::vector<std::pair<std::string, ValueId>> updates_;
  std::map<Dim, std::string> symbols_;
  std::map<Dim, DerivedDim> derived_;
  std::unordered_multimap<std::size_t, ValueId> index_;
};

/// The one-line message for a rule failure: "matmul: inner dimensions differ (64 vs 8)".
std::string shape_error_message(Op op, const ShapeResult& r, const std::vector<std::string>& operand_types);

/// Empty when every attribute the op does not read keeps its default; else why not ("attention:
/// has no attribute 'value' (it reads scale, ...)"). Graph::add and the IR text parser refuse such
/// a node: one meaning per attribute, and equal nodes compare equal.
std::string unread_attribute(Op op, const Attrs& attrs);

/// Hash of a node's op, inputs, attributes and region (for structural sharing).
std::size_t node_hash(Op op, const std::vector<ValueId>& inputs, const Attrs& a, const Graph* region = nullptr);

/// Whether cache_write or page_write `v` may write into its cache's storage (in place, only the new rows): the
/// cache is a graph input that the graph updates with `v`, and nothing else reads it (nor is it
/// an output), so no reader sees the rows change; and it is f32. Backends that hold the input
/// alias `v` to it.
bool writes_into_operand(const Graph& g, ValueId v);

}  // namespace qkv::ir
