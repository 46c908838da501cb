// Kernel fusion: elementwise chains as one kernel each. On lavapipe every dispatch costs about
// 0.14 ms whatever it computes (the decoder block at B = 2, N = 8 spent 53 of its 53 kernels'
// time on that), and on a GPU every unfused elementwise op is a round trip of its tensor through
// memory; a fused kernel reads its operands once and writes one result.
//
// Groups are grown from the last node backwards: a node is inlined into the kernel of the node
// that reads it when both are elementwise, it has the kernel's shape (so both are computed at
// the same element, and the kernel's operands broadcast to that shape as before), it is not a
// result, and every node that reads it is in that kernel. Candidates are taken in decreasing
// node order, so when a node is considered every node that reads it has been placed. Constants
// (one value, whatever their shape) are inlined wherever an elementwise kernel reads them (their value is a push
// constant); a constant also read by another kernel keeps its own.
#include "codegen/fusion.hpp"

#include <algorithm>
#include <bit>
#include <queue>

#include "codegen/glsl_detail.hpp"
#include "ir/bind.hpp"
#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

using ir::Node;
using ir::Op;
using ir::OpCategory;
using ir::ValueId;

bool elementwise(const Node& n) {
  switch (ir::op_info(n.op).category) {
    case OpCategory::unary:
    case OpCategory::binary:
    case OpCategory::select:
    case OpCategory::compare: return n.op != Op::broadcast_to;
    default: return false;
  }
}

/// A constant holds one value at every element whatever its shape, so a kernel that reads it
/// (broadcast to the kernel's shape) takes that value as a push constant.
bool scalar_constant(const Node& n) { return n.op == Op::constant; }

/// Reductions and softmax over one axis: their kernel reads its input through the chain of
/// elementwise nodes that computes it, when those are fused into it.
bool axis_reduction(const Node& n) { return n.op == Op::reduce_sum || n.op == Op::reduce_max || n.op == Op::softmax; }

/// Push-constant words before a fused kernel's chain: elements, or a reduction's three.
int leading_words(const Node& root) { return axis_reduction(root) ? 3 : 1; }

/// The constants a fused kernel inlines, in node order, and its other operands (memory reads).
struct Reads {
  std::vector<ValueId> constants, operands;
};

Reads reads_of(const ir::Graph& g, ValueId root, const std::vector<ValueId>& inlined, const std::vector<bool>& inline_constant) {
  std::vector<ValueId> members = inlined;
  members.push_back(root);
  Reads r;
  for (ValueId m : members)
    for (ValueId in : g.node(m).inputs) {
      if (std::find(members.begin(), members.end(), in) != members.end()) continue;
      auto& list = inline_constant[static_cast<std::size_t>(in)] ? r.constants : r.operands;
      if (std::find(list.begin(), list.end(), in) == list.end()) list.push_back(in);
    }
  std::sort(r.constants.begin(), r.constants.end());
  return r;
}

/// Push-constant words of a fused kernel: elements, dims, each operand's strides, each constant.
int push_words(const Node& root, int rank, const Reads& r) {
  return leading_words(root) + rank * (1 + static_cast<int>(r.operands.size())) + static_cast<int>(r.constants.size());
}

/// The shape every node of a fused kernel is computed over (see plan_kernels).
const ir::Shape& chain_shape(const ir::Graph& g, const Node& root, const std::vector<ir::Shape>* shapes, ValueId root_id) {
  const ValueId v = axis_reduction(root) ? root.inputs[0] : root_id;
  return shapes ? (*shapes)[static_cast<std::size_t>(v)] : g.node(v).shape;
}

void verify(const ir::Graph& g, const std::vector<KernelGroup>& plan) {
  std::vector<int> kernel_of(g.size(), -1);  // the kernel computing each node (constants: none)
  for (std::size_t k = 0; k < plan.size(); ++k) {
    kernel_of[static_cast<std::size_t>(plan[k].root)] = static_cast<int>(k);
    for (ValueId v : plan[k].inlined) {
      if (scalar_constant(g.node(v))) continue;
      QKV_ASSERT(kernel_of[static_cast<std::size_t>(v)] == -1, "kernel fusion: %" + std::to_string(v) + " in two kernels");
      kernel_of[static_cast<std::size_t>(v)] = static_cast<int>(k);
    }
  }
  auto inlined = [&](ValueId v) {
    const int k = kernel_of[static_cast<std::size_t>(v)];
    return k >= 0 && plan[static_cast<std::size_t>(k)].root != v;
  };
  for (ValueId v : g.result_values()) QKV_ASSERT(!inlined(v), "kernel fusion: result %" + std::to_string(v) + " inlined");
  for (std::size_t c = 0; c < g.size(); ++c)
    for (ValueId in : g.nodes()[c].inputs)
      QKV_ASSERT(!inlined(in) || kernel_of[c] == kernel_of[static_cast<std::size_t>(in)],
                 "kernel fusion: %" + std::to_string(in) + " is inlined but %" + std::to_string(c) + " reads it outside its kernel");
  for (std::size_t k = 0; k < plan.size(); ++k)
    for (ValueId in : plan[k].operands) {
      const int at = kernel_of[static_cast<std::size_t>(in)];
      QKV_ASSERT(!has_kernel(g.node(in)) || (at >= 0 && !inlined(in) && at < static_cast<int>(k)),
                 "kernel fusion: kernel %" + std::to_string(plan[k].root) + " reads %" + std::to_string(in) + ", which no earlier kernel stores");
    }
}

}  // namespace

std::vector<KernelGroup> plan_kernels(const ir::Graph& g, const FusionLimits& limits) {
  const std::size_t n = g.size();
  std::vector<std::vector<ValueId>> readers(n);
  for (std::size_t i = 0; i < n; ++i)
    for (ValueId in : g.nodes()[i].inputs) readers[static_cast<std::size_t>(in)].push_back(static_cast<ValueId>(i));
  std::vector<bool> is_result(n, false);
  for (ValueId v : g.result_values()) is_result[static_cast<std::size_t>(v)] = true;

  // Constants read only by elementwise nodes are inlined where they are read (as push constants).
  std::vector<bool> inline_constant(n, false);
  for (std::size_t i = 0; i < n; ++i)
    inline_constant[i] = scalar_constant(g.nodes()[i]) && !is_result[i] && !readers[i].empty() &&
                         std::all_of(readers[i].begin(), readers[i].end(), [&](ValueId c) { return elementwise(g.node(c)); });

  std::vector<ValueId> owner(n, -1);  // the root of the kernel computing each node
  std::vector<std::vector<ValueId>> inlined(n);
  for (std::size_t i = n; i-- > 0;) {
    const Node& root = g.nodes()[i];
    if (owner[i] != -1 || !has_kernel(root)) continue;
    const auto r = static_cast<ValueId>(i);
    owner[i] = r;
    if (!elementwise(root) && !axis_reduction(root)) continue;
    // Every node of the kernel is computed at the same element of this shape: the root's, or a
    // reduction's input's.
    const ir::Shape& shape = elementwise(root) ? root.shape : g.node(root.inputs[0]).shape;
    std::priority_queue<ValueId> candidates;
    for (ValueId in : root.inputs) candidates.push(in);
    while (!candidates.empty()) {
      const ValueId v = candidates.top();
      candidates.pop();
      const Node& node = g.node(v);
      auto& members = inlined[i];
      if (std::find(members.begin(), members.end(), v) != members.end()) continue;
      if (scalar_constant(node)) continue;  // placed with the kernel's reads below
      if (owner[static_cast<std::size_t>(v)] != -1 || !elementwise(node) || is_result[static_cast<std::size_t>(v)] || !(node.shape == shape)) continue;
      const auto& rs = readers[static_cast<std::size_t>(v)];
      if (!std::all_of(rs.begin(), rs.end(), [&](ValueId c) { return owner[static_cast<std::size_t>(c)] == r; })) continue;
      std::vector<ValueId> trial = members;
      trial.push_back(v);
      const Reads reads = reads_of(g, r, trial, inline_constant);
      if (push_words(root, shape.rank, reads) > kMaxPushWords || static_cast<int>(reads.operands.size()) + 1 > limits.storage_buffers) continue;
      members = std::move(trial);
      owner[static_cast<std::size_t>(v)] = r;
      for (ValueId in : node.inputs) candidates.push(in);
    }
  }
  std::vector<bool> own_kernel(n, false);
  for (std::size_t i = 0; i < n; ++i) own_kernel[i] = owner[i] == static_cast<ValueId>(i) && has_kernel(g.nodes()[i]) && !inline_constant[i];
  std::vector<KernelGroup> plan;
  for (std::size_t i = 0; i < n; ++i) {
    if (!own_kernel[i]) continue;
    KernelGroup k;
    k.root = static_cast<ValueId>(i);
    k.inlined = inlined[i];
    std::sort(k.inlined.begin(), k.inlined.end());
    const Node& root = g.nodes()[i];
    if (elementwise(root) || k.fused()) {
      // The constants it reads without a kernel of their own are computed inside it too.
      const Reads reads = reads_of(g, k.root, k.inlined, inline_constant);
      k.inlined.insert(k.inlined.end(), reads.constants.begin(), reads.constants.end());
      std::sort(k.inlined.begin(), k.inlined.end());
      if (k.fused()) k.operands = reads.operands;
    }
    if (!k.fused()) k.operands = root.inputs;
    plan.push_back(std::move(k));
  }
  verify(g, plan);
  return plan;
}

std::vector<KernelGroup> unfused_kernels(const ir::Graph& g) {
  std::vector<KernelGroup> plan;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (has_kernel(g.nodes()[i])) plan.push_back({static_cast<ValueId>(i), {}, g.nodes()[i].inputs});
  return plan;
}

std::string fused_name(const ir::Graph& g, const KernelGroup& k) {
  const Node& root = g.node(k.root);
  std::string name = "fused";
  for (ValueId m : k.inlined)
    if (!scalar_constant(g.node(m))) name += "_" + std::string(ir::op_name(g.node(m).op));
  return name + "_" + std::string(ir::op_name(root.op)) + "_r" + std::to_string(chain_shape(g, root, nullptr, k.root).rank);
}

KernelSource fused_source(const ir::Graph& g, const KernelGroup& k) {
  const Node& root = g.node(k.root);
  const bool reduction = axis_reduction(root);
  const ValueId chain_root = reduction ? root.inputs[0] : k.root;
  QKV_ASSERT(!reduction || std::find(k.inlined.begin(), k.inlined.end(), chain_root) != k.inlined.end(), "kernel fusion: a reduction fused without its input");
  const int rank = chain_shape(g, root, nullptr, k.root).rank;
  const int operands = static_cast<int>(k.operands.size()), base = leading_words(root);
  std::vector<ValueId> constants;
  for (ValueId v : k.inlined)
    if (scalar_constant(g.node(v))) constants.push_back(v);
  std::vector<Op> ops;
  std::vector<ValueId> members = k.inlined;
  if (!reduction) members.push_back(k.root);
  for (ValueId m : members) ops.push_back(g.node(m).op);
  auto word = [&](int w) { return "pc.p[" + std::to_string(base + w) + "]"; };
  std::string s = detail::kernel_header(operands) + detail::math_helpers_of(ops);
  s += "// computes " + covered_nodes(g, k) + "\n";
  s += "// p[" + std::to_string(base) + "..] = the " + std::to_string(rank) + " dims of the elements below, then each operand's strides, then each constant's float bits\n";
  s += "// The value of %" + std::to_string(chain_root) + " at its element i.\nfloat qkv_chain(uint i) {\n" + detail::operand_offsets(rank, operands, base);
  auto value = [&](ValueId v) {
    if (auto it = std::find(k.operands.begin(), k.operands.end(), v); it != k.operands.end()) {
      const auto o = std::to_string(it - k.operands.begin());
      return "x" + o + "[o" + o + "]";
    }
    if (auto it = std::find(constants.begin(), constants.end(), v); it != constants.end())
      return "uintBitsToFloat(" + word(rank * (1 + operands) + static_cast<int>(it - constants.begin())) + ")";
    return "v" + std::to_string(v);
  };
  for (ValueId m : members) {
    const Node& node = g.node(m);
    if (scalar_constant(node)) continue;
    std::vector<std::string> args;
    for (ValueId in : node.inputs) args.push_back(value(in));
    s += "  float v" + std::to_string(m) + " = " + detail::elementwise_expression(node.op, args) + ";  // %" + std::to_string(m) + " " +
         std::string(ir::op_name(node.op)) + "\n";
  }
  s += "  return v" + std::to_string(chain_root) + ";\n}\n";
  if (reduction) s += detail::axis_body(root.op, "qkv_chain(", ")");
  else s += "void main() {\n" + detail::linear_index() + "  y[i] = qkv_chain(i);\n}\n";
  return {fused_name(g, k), s, operands + 1};
}

KernelLaunch fused_launch(const ir::Graph& g, const KernelGroup& k, const std::vector<ir::Shape>& shapes) {
  const Node& root = g.node(k.root);
  const ir::Shape& cs = chain_shape(g, root, &shapes, k.root);
  KernelLaunch l;
  if (axis_reduction(root)) {
    std::int64_t outer = 1, inner = 1;
    for (int i = 0; i < root.attrs.axis; ++i) outer *= cs[i];
    for (int i = root.attrs.axis + 1; i < cs.rank; ++i) inner *= cs[i];
    l.push = {detail::push_word(outer * inner), detail::push_word(cs[root.attrs.axis]), detail::push_word(inner)};
    l.groups = detail::elementwise_groups(outer * inner);
  } else {
    l.push = {detail::push_word(cs.numel())};
    l.groups = detail::elementwise_groups(cs.numel());
  }
  for (int d = 0; d < cs.rank; ++d) l.push.push_back(detail::push_word(cs[d]));
  for (ValueId in : k.operands) {
    const auto st = detail::broadcast_strides(shapes[static_cast<std::size_t>(in)], cs.rank);
    for (int d = 0; d < cs.rank; ++d) l.push.push_back(detail::push_word(st[static_cast<std::size_t>(d)]));
  }
  for (ValueId v : k.inlined)
    if (scalar_constant(g.node(v))) l.push.push_back(std::bit_cast<std::uint32_t>(static_cast<float>(ir::bound_value(g, g.node(v), shapes))));
  QKV_ASSERT(static_cast<int>(l.push.size()) <= kMaxPushWords, "kernel fusion: too many push-constant words");
  return l;
}

std::string covered_nodes(const ir::Graph& g, const KernelGroup& k) {
  std::string s;
  for (ValueId v : k.inlined) s += "%" + std::to_string(v) + " " + std::string(ir::op_name(g.node(v).op)) + ", ";
  return s + "%" + std::to_string(k.root) + " " + std::string(ir::op_name(g.node(k.root).op));
}

}  // namespace qkv::codegen
