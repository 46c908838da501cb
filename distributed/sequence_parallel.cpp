// Sequence parallelism for whole graphs: an analysis that every node is local to positions or is
// attention over the sequence, then stages (backend executables) between ring attentions.
#include "distributed/sequence_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "ir/region.hpp"

namespace qkv::distributed {

namespace {

using ir::Graph;
using ir::Node;
using ir::Op;
using ir::ValueId;

/// Rows `rows` of `t` along `axis` (elements of any dtype), in that order.
Tensor take_along(const Tensor& t, int axis, const std::vector<std::int64_t>& rows) {
  std::vector<std::int64_t> shape = t.shape();
  const std::size_t elem = t.numel() ? t.nbytes() / static_cast<std::size_t>(t.numel()) : 1;
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= shape[static_cast<std::size_t>(i)];
  for (std::size_t i = static_cast<std::size_t>(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
  const std::int64_t n = shape[static_cast<std::size_t>(axis)];
  shape[static_cast<std::size_t>(axis)] = static_cast<std::int64_t>(rows.size());
  Tensor r = Tensor::uninitialized(t.dtype(), shape);
  const std::size_t row_bytes = static_cast<std::size_t>(inner) * elem;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::memcpy(r.raw() + (static_cast<std::size_t>(o) * rows.size() + i) * row_bytes,
                  t.raw() + static_cast<std::size_t>(o * n + rows[i]) * row_bytes, row_bytes);
  return r;
}

// What most often leaves a softmax or matmul over the sequence in a graph.
// Stage inputs fed with a rank's positions in the sequence (named by the iota they stand for).
const std::string kPositions = "sp.positions.";

const std::string kUnfused =
    ": attention that is not fused, because an output (the weights, say) keeps its score matrix? Ask only for the outputs you need "
    "(select_outputs; qkv run --out)";

}  // namespace

struct SequenceParallel::Impl {
  Communicator& comm;
  backend::Backend& backend;
  SequenceLayout layout;
  Graph g;  // fused
  std::vector<ir::Dim> sequence;
  std::string sequence_names;
  struct Stage {
    Graph graph;
    std::unique_ptr<backend::Executable> exe;
  };
  std::vector<Stage> stages;                       // stage k: the nodes of level k
  std::vector<std::vector<ValueId>> attention_at;  // ring attentions before stage k (level k)
  // One ring attention per (q, k, v, causal, modifier, sinks): the forward, its log-sum-exp and its
  // gradients (for each dy) are computed once a run, however many nodes read them.
  struct Ring {
    std::unique_ptr<RingAttention> attention;
    double scale = 0;
    bool forward_done = false;
    Tensor y;
    std::map<ValueId, RingAttention::Gradients> gradients;
  };
  using RingKey = std::tuple<ValueId, ValueId, ValueId, bool, const ir::Graph*, ValueId>;  // .., the sinks (-1: none)
  std::map<RingKey, Ring> rings;
  // For each sequence dim, an input that carries it and the axis: where a run reads how many rows
  // a rank holds, for the positions an iota along the sequence gives.
  std::map<ir::Dim, std::pair<std::string, int>> rows_from;

  Impl(Communicator& c, backend::Backend& b, SequenceLayout l) : comm(c), backend(b), layout(l) {}

  bool mentions(ir::Dim d) const {
    if (std::find(sequence.begin(), sequence.end(), d) != sequence.end()) return true;
    auto it = g.derived_dims().find(d);
    return it != g.derived_dims().end() && (mentions(it->second.a) || mentions(it->second.b));
  }
  std::vector<int> sequence_axes(const ir::Shape& s) const {
    std::vector<int> r;
    for (int i = 0; i < s.rank; ++i)
      if (mentions(s[i])) r.push_back(i);
    return r;
  }
  /// The axis of a graph input or output along which it is sharded, or -1; throws when it has
  /// the sequence in more than one axis or inside a derived dim (its rows would not be positions).
  int boundary_axis(const std::string& what, ValueId v) const {
    const ir::Shape& s = g.node(v).shape;
    const std::vector<int> axes = sequence_axes(s);
    if (axes.empty()) return -1;
    const ir::Dim d = s[axes.front()];
    if (axes.size() > 1 || std::find(sequence.begin(), sequence.end(), d) == sequence.end())
      throw UnsupportedError("sequence parallel: " + what + " " + g.type_string(v) + " must carry the sequence (" + sequence_names +
                             ") as one whole dim");
    return axes.front();
  }

  [[noreturn]] void refuse(ValueId id, const std::string& why) const {
    throw UnsupportedError("sequence parallel: " + std::string(ir::op_name(g.node(id).op)) + " %" + std::to_string(id) + " : " + g.type_string(id) +
                           " " + why + " (the sequence: " + sequence_names + ")");
  }

  bool operand_axis_mentions(const Node& n, std::size_t operand, int axis) const {
    const ir::Shape& s = g.node(n.inputs[operand]).shape;
    const int a = axis < 0 ? axis + s.rank : axis;
    return a >= 0 && a < s.rank && mentions(s[a]);
  }

  /// A sum over the sequence: each rank computes its rows' part, and the parts are summed over the
  /// ranks (allreduce) before anything reads it. What a backward makes of weights' gradients.
  bool is_partial(ValueId id) const {
    const Node& n = g.node(id);
    if (n.op == Op::reduce_sum) return operand_axis_mentions(n, 0, n.attrs.axis);
    if (n.op == Op::matmul) return operand_axis_mentions(n, 0, n.attrs.transpose_a ? -2 : -1);
    return false;
  }
  /// Attention over the sequence and its backward ops: run as ring attention.
  static bool is_ring(Op op) {
    return op == Op::attention || op == Op::flex_attention || op == Op::attention_lse || op == Op::flex_attention_lse || op == Op::attention_grad ||
           op == Op::flex_attention_grad;
  }

  void check(ValueId id) const {
    const Node& n = g.node(id);
    if (sequence_axes(n.shape).size() > 1) refuse(id, "holds the sequence on two axes" + kUnfused);
    // A value of the sequence's length (a count, a 1/sqrt(N) scale) would be one rank's length.
    if (n.attrs.rsqrt_of != 0 && mentions(n.attrs.rsqrt_of)) refuse(id, "is a value of the sequence's length, which each rank would take as its own");
    switch (ir::op_info(n.op).category) {
      case ir::OpCategory::source:
      case ir::OpCategory::unary:
      case ir::OpCategory::binary:
      case ir::OpCategory::select:
      case ir::OpCategory::compare: return;
      case ir::OpCategory::reduce:  // a sum over the sequence is a partial sum; a maximum is not yet
        if (n.op == Op::reduce_max && operand_axis_mentions(n, 0, n.attrs.axis)) refuse(id, "takes a maximum over the sequence");
        return;
      case ir::OpCategory::contract: return;  // over the sequence: a partial sum
      case ir::OpCategory::layout:
        if ((n.op == Op::slice || n.op == Op::concat) && operand_axis_mentions(n, 0, n.attrs.axis)) refuse(id, "slices or joins along the sequence");
        return;
      case ir::OpCategory::mask:
        if (n.op == Op::iota && positions_of(id) != 0) return;                       // fed each rank's positions in the sequence
        if (n.op == Op::iota && !operand_axis_mentions(n, 0, n.attrs.axis)) return;  // indices along another axis
        if (n.op != Op::one_hot && n.op != Op::embedding && !sequence_axes(n.shape).empty()) refuse(id, "depends on positions in the sequence");
        return;
      case ir::OpCategory::composite: check_composite(id); return;
    }
  }

  /// The sequence dim whose positions an iota along the sequence gives (whole dims only), or 0.
  ir::Dim positions_of(ValueId id) const {
    const Node& n = g.node(id);
    if (n.op != Op::iota) return 0;
    const int a = n.attrs.axis < 0 ? n.attrs.axis + n.shape.rank : n.attrs.axis;
    const ir::Dim d = n.shape[a];
    return std::find(sequence.begin(), sequence.end(), d) != sequence.end() ? d : 0;
  }

  /// Whether `n` is a mean over the sequence: decomposed into a sum over it and a count (a sum of
  /// ones over it), both partial sums, so that the count is the whole sequence's.
  bool is_mean_over_sequence(const Node& n) const { return n.op == Op::reduce_mean && operand_axis_mentions(n, 0, n.attrs.axis); }

  void check_composite(ValueId id) const {
    const Node& n = g.node(id);
    if (n.op == Op::softmax || n.op == Op::log_softmax) {
      if (operand_axis_mentions(n, 0, n.attrs.axis)) refuse(id, "reduces over the sequence" + kUnfused);
      return;
    }
    if (n.op == Op::reduce_mean) return;  // over another axis (means over the sequence are decomposed)
    if (n.op == Op::masked_attention)
      refuse(id, "takes a mask tensor (sharding it is not supported yet: write the mask as causal or a score modifier)");
    if (ir::attention_roles(n.op).jvp()) refuse(id, "is attention's tangent (forward mode), which ring attention does not compute yet");
    if (!is_ring(n.op)) refuse(id, "is not supported sequence-parallel yet (a masked attention's backward?)");
    if (n.attrs.window != 0) refuse(id, "has a sliding window (not supported by ring attention yet: write it as a score modifier)");
    // q, k, v (and dy, lse, delta for the gradient): fixed operands; a flex op with more reads tensors.
    const std::size_t fixed = n.op == Op::attention_lse || n.op == Op::flex_attention_lse     ? 2
                              : n.op == Op::attention_grad || n.op == Op::flex_attention_grad ? 6
                                                                                              : 3;
    const bool sink = ir::has_sink(n.op, n.attrs);
    if (n.inputs.size() != fixed + (sink ? 1 : 0) || n.attrs.dropout != 0)
      refuse(id, "reads tensors in its score modifier or drops out weights (not supported by ring attention yet)");
    if (sink) {
      const ValueId s = n.inputs.back();
      const std::vector<int> axes = sequence_axes(g.node(s).shape);
      if (!axes.empty() && (axes.size() != 1 || axes.front() != g.node(s).shape.rank - 2))
        refuse(id, "has sinks " + g.type_string(s) + " that carry the sequence elsewhere than on its rows (axis -2)");
      if (g.node(s).op == Op::constant) refuse(id, "has sinks that are a constant (give them as an input)");
      if (g.node(s).dtype != DType::f32) refuse(id, "has sinks " + g.type_string(s) + " that are not f32");
    }
    // A gradient finds its forward's sinks through the lse it reads: where another op gives that
    // lse, and an attention over the same q and k has sinks, which ring it belongs to is unknown.
    if (const int lse = ir::attention_roles(n.op).lse; lse >= 0) {
      const Op from = g.node(n.inputs[static_cast<std::size_t>(lse)]).op;
      if (from != Op::attention_lse && from != Op::flex_attention_lse)
        for (const Node& other : g.nodes())
          if (ir::has_sink(other.op, other.attrs) && other.inputs[0] == n.inputs[0] && other.inputs[1] == n.inputs[1])
            refuse(id, "reads an lse that no attention_lse node gives, beside an attention with sinks");
    }
    for (std::size_t i = 0; i < fixed; ++i) {
      const ir::Shape& s = g.node(n.inputs[i]).shape;
      const std::vector<int> axes = sequence_axes(s);
      if (axes.size() != 1 || axes.front() != s.rank - 2) refuse(id, "needs the sequence on axis -2 of q, k and v, and on no other axis");
    }
  }

  /// The positions in the whole sequence of this rank's rows, shaped as stage input `n` (the
  /// sequence's axis, 1 elsewhere).
  Tensor positions(const Node& n, const backend::TensorMap& shards) const {
    ir::Dim d = 0;
    std::vector<std::int64_t> shape;
    for (int a = 0; a < n.shape.rank; ++a) {
      if (n.shape[a] != 1) d = n.shape[a];
      shape.push_back(1);
    }
    const auto& [input, axis] = rows_from.at(d);
    const std::int64_t rows = shards.at(input).shape()[static_cast<std::size_t>(axis)];
    const std::vector<std::int64_t> at = shard_rows(rows * comm.size(), comm.rank(), comm.size(), layout);
    for (int a = 0; a < n.shape.rank; ++a)
      if (n.shape[a] == d) shape[static_cast<std::size_t>(a)] = rows;
    Tensor t = Tensor::uninitialized(DType::f32, shape);
    std::transform(at.begin(), at.end(), t.data<float>(), [](std::int64_t r) { return static_cast<float>(r); });
    return t;
  }

  /// The sinks of attention node `id` (-1: none); a gradient's are its forward's, whose lse it reads.
  ValueId sinks_of(ValueId id) const {
    const Node& n = g.node(id);
    if (ir::has_sink(n.op, n.attrs)) return n.inputs[ir::sink_operand(n.op, n.attrs, n.inputs.size())];
    if (const int lse = ir::attention_roles(n.op).lse; lse >= 0) return sinks_of(n.inputs[static_cast<std::size_t>(lse)]);
    return -1;
  }

  /// The attention node's scale: its scale attribute, over sqrt of its rsqrt_of dim's size when it has one.
  double scale_of(ValueId id, const std::map<ValueId, Tensor>& values) const {
    const Node& n = g.node(id);
    if (n.attrs.rsqrt_of == 0) return n.attrs.scale;
    if (!ir::is_symbol(n.attrs.rsqrt_of)) return ir::rsqrt_scaled(n.attrs.scale, n.attrs.rsqrt_of);
    for (std::size_t i = 0; i < std::min<std::size_t>(3, n.inputs.size()); ++i) {
      const ir::Shape& s = g.node(n.inputs[i]).shape;
      for (int a = 0; a < s.rank; ++a)
        if (s[a] == n.attrs.rsqrt_of) return ir::rsqrt_scaled(n.attrs.scale, values.at(n.inputs[i]).shape()[static_cast<std::size_t>(a)]);
    }
    refuse(id, "has a scale of a dim none of q, k, v has");
  }
};

SequenceParallel::SequenceParallel(Communicator& comm, backend::Backend& backend, const ir::Graph& graph, std::vector<std::string> sequence_dims,
                                   SequenceLayout layout)
    : impl_(std::make_unique<Impl>(comm, backend, layout)) {
  Impl& m = *impl_;
  m.g = ir::eliminate_dead_code(ir::fuse_attention(graph, [](const Node&) { return true; }));
  for (const auto& name : sequence_dims) {
    const ir::Dim d = ir::symbol_id(name);
    if (!m.g.symbols().contains(d)) continue;  // a name the graph does not use (M of self-attention)
    m.sequence.push_back(d);
    m.sequence_names += (m.sequence_names.empty() ? "" : ", ") + name;
  }
  if (m.sequence.empty()) {
    std::string names;
    for (const auto& n : sequence_dims) names += (names.empty() ? "" : ", ") + n;
    throw UsageError("sequence parallel: the graph has none of the sequence dims " + names);
  }
  m.g = ir::eliminate_dead_code(ir::decompose_composites(m.g, [&](const Node& n) { return !m.is_mean_over_sequence(n); }));
  // Every node local to positions or attention over the sequence; inputs and outputs sharded
  // along one whole dim.
  // Values only an iota reads (for their shape: RoPE's grid of frequencies, say) may mix
  // positions: a rank computes them on its rows, with the same shape.
  std::vector<bool> value_read(m.g.size(), false);
  for (const auto& [name, v] : m.g.outputs()) value_read[static_cast<std::size_t>(v)] = true;
  for (std::size_t i = m.g.size(); i-- > 0;)
    if (value_read[i] && m.g.nodes()[i].op != Op::iota)
      for (ValueId v : m.g.nodes()[i].inputs) value_read[static_cast<std::size_t>(v)] = true;
  for (ValueId v = 0; v < static_cast<ValueId>(m.g.size()); ++v)
    if (value_read[static_cast<std::size_t>(v)]) m.check(v);
  for (ValueId v : m.g.inputs()) {
    const int axis = m.boundary_axis("input '" + m.g.node(v).name + "'", v);
    if (axis >= 0) m.rows_from.try_emplace(m.g.node(v).shape[axis], m.g.node(v).name, axis);
  }
  for (ValueId v = 0; v < static_cast<ValueId>(m.g.size()); ++v)
    if (const ir::Dim d = m.positions_of(v); d != 0 && !m.rows_from.contains(d)) m.refuse(v, "gives positions in a sequence no input carries whole");
  for (const auto& [name, v] : m.g.outputs()) m.boundary_axis("output '" + name + "'", v);

  // Levels: attention nodes start a new one; a node runs in its level's stage.
  const std::size_t n = m.g.size();
  std::vector<int> level(n, 0);
  int top = 0;
  // A partial sum's readers wait for the next level (after its allreduce).
  auto is_attention = [&](ValueId v) { return Impl::is_ring(m.g.node(v).op); };
  for (std::size_t i = 0; i < n; ++i) {
    for (ValueId v : m.g.nodes()[i].inputs) level[i] = std::max(level[i], level[static_cast<std::size_t>(v)] + (m.is_partial(v) ? 1 : 0));
    if (is_attention(static_cast<ValueId>(i))) ++level[i];
    top = std::max(top, level[i]);
  }
  // Values read outside the stage that makes them: by another stage, a ring attention, or as outputs.
  auto copied = [&](ValueId v) { return m.g.node(v).op == Op::constant || m.g.node(v).op == Op::input; };
  std::vector<bool> leaves(n, false);
  for (std::size_t i = 0; i < n; ++i)
    for (ValueId v : m.g.nodes()[i].inputs)
      if (!copied(v) && (is_attention(static_cast<ValueId>(i)) || is_attention(v) || level[static_cast<std::size_t>(v)] != level[i]))
        leaves[static_cast<std::size_t>(v)] = true;
  for (const auto& [name, v] : m.g.outputs()) leaves[static_cast<std::size_t>(v)] = !copied(v) || m.g.node(v).op == Op::constant;

  m.stages.resize(static_cast<std::size_t>(top) + 1);
  m.attention_at.resize(static_cast<std::size_t>(top) + 1);
  for (int k = 0; k <= top; ++k) {
    Graph& s = m.stages[static_cast<std::size_t>(k)].graph;
    s.copy_symbols(m.g);
    std::vector<ValueId> map(n, -1);
    auto operand = [&](ValueId v) {
      ValueId& to = map[static_cast<std::size_t>(v)];
      if (to >= 0) return to;
      const Node& src = m.g.node(v);
      if (src.op == Op::input) to = s.add_input(src.name, src.dtype, src.shape);
      else if (src.op == Op::constant) to = s.add_like(src, {});
      else to = s.add_input("sp." + std::to_string(v), src.dtype, src.shape);  // made by an earlier stage or a ring
      return to;
    };
    for (std::size_t i = 0; i < n; ++i) {
      const ValueId id = static_cast<ValueId>(i);
      if (level[i] != k || m.g.node(id).op == Op::input) continue;
      if (is_attention(id)) {
        m.attention_at[static_cast<std::size_t>(k)].push_back(id);
        continue;
      }
      if (m.g.node(id).op == Op::constant && !leaves[i]) continue;  // copied where used
      if (const ir::Dim d = m.positions_of(id); d != 0) {
        // This rank's rows' positions in the whole sequence, fed each run, broadcast to the shape.
        const ir::Shape& shape = m.g.node(id).shape;
        ir::Shape column;
        for (int a = 0; a < shape.rank; ++a) column.push_back(shape[a] == d ? d : 1);
        const ValueId positions = s.add_input(kPositions + std::to_string(i), DType::f32, column);
        map[i] = s.add(Op::add, {s.constant(0.0, shape), positions});
      } else {
        std::vector<ValueId> inputs;
        for (ValueId v : m.g.nodes()[i].inputs) inputs.push_back(operand(v));
        map[i] = s.add_like(m.g.node(id), std::move(inputs));
      }
      if (leaves[i]) s.set_output("sp." + std::to_string(i), map[i]);
    }
    if (!s.outputs().empty()) m.stages[static_cast<std::size_t>(k)].exe = backend.compile(s);
  }
}

SequenceParallel::~SequenceParallel() = default;

const ir::Graph& SequenceParallel::graph() const { return impl_->g; }

int SequenceParallel::stages() const {
  int r = 0;
  for (const auto& s : impl_->stages) r += s.exe != nullptr;
  return r;
}

int SequenceParallel::ring_attentions() const {
  int r = 0;
  for (const auto& a : impl_->attention_at) r += static_cast<int>(a.size());
  return r;
}

int SequenceParallel::sequence_axis(const std::string& name) const {
  const Impl& m = *impl_;
  for (ValueId v : m.g.inputs())
    if (m.g.node(v).name == name) return m.boundary_axis("input '" + name + "'", v);
  for (const auto& [o, v] : m.g.outputs())
    if (o == name) return m.boundary_axis("output '" + name + "'", v);
  throw UsageError("sequence parallel: the graph has no input or output '" + name + "'");
}

backend::TensorMap SequenceParallel::run_shards(const backend::TensorMap& shards) {
  Impl& m = *impl_;
  std::map<ValueId, Tensor> values;
  for (auto& [key, r] : m.rings) {
    r.forward_done = false;
    r.gradients.clear();
  }
  // The ring for attention node `node` over q, k, v, its forward run once this run.
  auto ring_for = [&](ValueId node, ValueId q, ValueId k, ValueId v) -> Impl::Ring& {
    const Node& n = m.g.node(node);
    const double scale = m.scale_of(node, values);
    if (!(scale > 0)) m.refuse(node, "has a scale that is not positive");
    const ValueId sinks = m.sinks_of(node);
    Impl::Ring& r = m.rings[{q, k, v, n.attrs.causal, n.region.get(), sinks}];
    if (!r.attention || r.scale != scale) {
      RingAttentionOptions o;
      o.scale = scale;
      o.causal = n.attrs.causal;
      o.layout = m.layout;
      o.score_mod = n.region;
      r.attention = std::make_unique<RingAttention>(m.comm, m.backend, o);
      r.scale = scale;
      r.forward_done = false;
    }
    if (!r.forward_done) {
      r.y = r.attention->forward(values.at(q), values.at(k), values.at(v), sinks >= 0 ? &values.at(sinks) : nullptr);
      r.forward_done = true;
    }
    return r;
  };
  for (ValueId v : m.g.inputs()) {
    auto it = shards.find(m.g.node(v).name);
    if (it == shards.end()) throw ShapeError("sequence parallel: no value for input '" + m.g.node(v).name + "'");
    values.emplace(v, it->second);
  }
  for (std::size_t k = 0; k < m.stages.size(); ++k) {
    for (ValueId a : m.attention_at[k]) {
      const Node& n = m.g.node(a);
      const ir::AttentionRoles& roles = ir::attention_roles(n.op);
      const ValueId q = n.inputs[static_cast<std::size_t>(roles.q)], kk = n.inputs[static_cast<std::size_t>(roles.k)];
      if (n.op == Op::attention_lse || n.op == Op::flex_attention_lse) {
        // The forward over these q and k has it; v does not matter (k stands in when there is none).
        Impl::Ring* found = nullptr;
        for (auto& [key, r] : m.rings)
          if (std::get<0>(key) == q && std::get<1>(key) == kk && std::get<3>(key) == n.attrs.causal && std::get<4>(key) == n.region.get() &&
              std::get<5>(key) == m.sinks_of(a) && r.forward_done)
            found = &r;
        if (!found) found = &ring_for(a, q, kk, kk);
        values.insert_or_assign(a, found->attention->lse());
        continue;
      }
      Impl::Ring& r = ring_for(a, q, kk, n.inputs[static_cast<std::size_t>(roles.v)]);
      if (n.op == Op::attention || n.op == Op::flex_attention) {
        values.insert_or_assign(a, r.y);
        continue;
      }
      // The gradients: one backward ring for every wrt with the same dy.
      const ValueId dy = n.inputs[static_cast<std::size_t>(roles.dy)];
      auto it = r.gradients.find(dy);
      if (it == r.gradients.end()) it = r.gradients.emplace(dy, r.attention->backward(values.at(dy))).first;
      values.insert_or_assign(a, n.attrs.wrt == 0 ? it->second.dq : n.attrs.wrt == 1 ? it->second.dk : it->second.dv);
    }
    Impl::Stage& s = m.stages[k];
    if (!s.exe) continue;
    backend::TensorMap in;
    for (ValueId v : s.graph.inputs()) {
      const std::string& name = s.graph.node(v).name;
      if (name.starts_with(kPositions)) in.emplace(name, m.positions(s.graph.node(v), shards));
      else in.emplace(name, name.starts_with("sp.") ? values.at(static_cast<ValueId>(std::stol(name.substr(3)))) : shards.at(name));
    }
    for (auto& [name, t] : s.exe->run(in)) {
      const auto id = static_cast<ValueId>(std::stol(name.substr(3)));
      if (m.is_partial(id)) m.comm.allreduce_sum(std::span<float>(t.data<float>(), static_cast<std::size_t>(t.numel())));  // the ranks' parts
      values.insert_or_assign(id, std::move(t));
    }
  }
  backend::TensorMap out;
  for (const auto& [name, v] : m.g.outputs()) out.emplace(name, values.at(v));
  return out;
}

backend::TensorMap SequenceParallel::run(const backend::TensorMap& inputs) {
  Impl& m = *impl_;
  const int P = m.comm.size(), rank = m.comm.rank();
  backend::TensorMap shards;
  for (const auto& [name, t] : inputs) {
    const int axis = sequence_axis(name);
    shards.emplace(name, axis < 0 ? t : take_along(t, axis, shard_rows(t.shape()[static_cast<std::size_t>(axis)], rank, P, m.layout)));
  }
  backend::TensorMap out = run_shards(shards), whole;
  for (auto& [name, t] : out) {
    const int axis = sequence_axis(name);
    if (axis < 0) {
      whole.emplace(name, std::move(t));
      continue;
    }
    // Every rank's rows, placed at their positions in the sequence.
    const std::vector<std::byte> all = m.comm.allgather(std::span<const std::byte>(t.raw(), t.nbytes()));
    const std::int64_t rows = t.shape()[static_cast<std::size_t>(axis)], n = rows * P;
    std::vector<std::int64_t> shape = t.shape();
    shape[static_cast<std::size_t>(axis)] = n;
    Tensor w = Tensor::uninitialized(t.dtype(), shape);
    std::int64_t outer = 1, inner = 1;
    for (int i = 0; i < axis; ++i) outer *= shape[static_cast<std::size_t>(i)];
    for (std::size_t i = static_cast<std::size_t>(axis) + 1; i < shape.size(); ++i) inner *= shape[i];
    const std::size_t row_bytes = t.numel() ? t.nbytes() / static_cast<std::size_t>(t.numel()) * static_cast<std::size_t>(inner) : 0;
    for (int r = 0; r < P; ++r) {
      const std::vector<std::int64_t> at = shard_rows(n, r, P, m.layout);
      const std::byte* src = all.data() + t.nbytes() * static_cast<std::size_t>(r);
      for (std::int64_t o = 0; o < outer; ++o)
        for (std::size_t i = 0; i < at.size(); ++i)
          std::memcpy(w.raw() + static_cast<std::size_t>(o * n + at[i]) * row_bytes, src + (static_cast<std::size_t>(o) * at.size() + i) * row_bytes,
                      row_bytes);
    }
    whole.emplace(name, std::move(w));
  }
  return whole;
}

namespace {

class SequenceParallelExecutable : public backend::Executable {
 public:
  explicit SequenceParallelExecutable(std::unique_ptr<SequenceParallel> sp) : sp_(std::move(sp)) {}
  backend::TensorMap run(const backend::TensorMap& inputs) override { return sp_->run(inputs); }
  const ir::Graph& graph() const override { return sp_->graph(); }
  void set_state(backend::TensorMap) override {
    throw UnsupportedError("sequence parallel: held state (training) is not supported; train data-parallel (train::DataParallel)");
  }
  backend::TensorMap state() override { return {}; }
  std::int64_t planned_bytes() const override { return 0; }

 private:
  std::unique_ptr<SequenceParallel> sp_;
};

class SequenceParallelBackend : public backend::Backend {
 public:
  SequenceParallelBackend(Communicator& comm, std::unique_ptr<backend::Backend> inner, std::vector<std::string> dims, SequenceLayout layout)
      : comm_(comm), inner_(std::move(inner)), dims_(std::move(dims)), layout_(layout) {}
  std::string name() const override { return inner_->name(); }
  std::string device() const override { return inner_->device() + "; sequence-parallel over " + std::to_string(comm_.size()) + " ranks"; }
  bool supports(const ir::Node& n) const override { return inner_->supports(n); }
  std::string determinism() const override {
    return inner_->determinism() +
           "; ring attention merges the key blocks in the ring's fixed order: the same bits every run at this rank count, not those of one process";
  }
  std::unique_ptr<backend::Executable> compile(const ir::Graph& g) override {
    return std::make_unique<SequenceParallelExecutable>(std::make_unique<SequenceParallel>(comm_, *inner_, g, dims_, layout_));
  }
  std::string kernel_name(const ir::Graph& lowered, ir::ValueId v) const override {
    const ir::Op op = lowered.node(v).op;
    return op == ir::Op::attention || op == ir::Op::flex_attention ? "ring attention" : "a stage on " + inner_->name();
  }

 private:
  Communicator& comm_;
  std::unique_ptr<backend::Backend> inner_;
  std::vector<std::string> dims_;
  SequenceLayout layout_;
};

}  // namespace

std::unique_ptr<backend::Backend> sequence_parallel_backend(Communicator& comm, std::unique_ptr<backend::Backend> inner,
                                                            std::vector<std::string> sequence_dims, SequenceLayout layout) {
  return std::make_unique<SequenceParallelBackend>(comm, std::move(inner), std::move(sequence_dims), layout);
}

}  // namespace qkv::distributed
