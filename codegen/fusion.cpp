// Kernel fusion: elementwise chains as one kernel each. On lavapipe every dispatch costs about
// 0.05-0.14 ms whatever it computes (the decoder block at B = 2, N = 8 spent 53 of its 53 kernels'
// time on that), and on a GPU every unfused elementwise op is a round trip of its tensor through
// memory; a fused kernel reads its operands once and writes one result.
//
// Groups are grown from the last node backwards: a node is inlined into the kernel of the node
// that reads it when both are elementwise, it is not a result, and every node that reads it is in
// that kernel, or every kernel that reads it (at most four) can compute it too: then each
// recomputes it (XLA duplicates cheap producers the same way), and where one reader cannot (a
// matmul, a view) the node is stored and the plan made again. Every node of a kernel is
// computed at the kernel's element: a node of a smaller
// shape (a layer norm's per-row mean) is recomputed there, at the element it broadcasts from, so
// its operands are read through their strides broadcast to the kernel's shape (broadcasting
// composes). Candidates are taken in decreasing node order, so when a node is considered every
// node that reads it has been placed. Constants (one value, whatever their shape) are inlined
// wherever an elementwise kernel reads them (their value is a push constant); a constant also
// read by another kernel keeps its own.
//
// A matmul of the kernel's shape is inlined as its epilogue: the matmul kernel computes the
// elementwise chain (bias add, activation, residual add) on each product before it stores it,
// so the product never reaches memory.
#include "codegen/fusion.hpp"

#include <algorithm>
#include <bit>
#include <queue>

#include "codegen/glsl_detail.hpp"
#include "codegen/matmul_glsl.hpp"
#include "ir/bind.hpp"
#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

using ir::Node;
using ir::Op;
using ir::OpCategory;
using ir::ValueId;

/// Nodes computed at each element of their kernel from their operands' values at that element
/// (broadcast_to too: its operand is read through strides broadcast to the kernel's shape, like
/// every operand of a smaller shape).
bool elementwise(const Node& n) {
  switch (ir::op_info(n.op).category) {
    case OpCategory::unary:
    case OpCategory::binary:
    case OpCategory::select:
    case OpCategory::compare: return true;
    default: return n.op == Op::broadcast_to;
  }
}

/// An elementwise node read by more kernels than this is stored, not recomputed in each.
constexpr std::size_t kMostRecomputingReaders = 4;

/// A constant holds one value at every element whatever its shape, so a kernel that reads it
/// (broadcast to the kernel's shape) takes that value as a push constant.
bool scalar_constant(const Node& n) { return n.op == Op::constant; }

/// Reductions and softmax over one axis: their kernel reads its input through the chain of
/// elementwise nodes that computes it, when those are fused into it.
bool axis_reduction(const Node& n) { return n.op == Op::reduce_sum || n.op == Op::reduce_max || n.op == Op::softmax; }

/// The matmul a kernel computes its chain on (its epilogue's), or -1.
ValueId matmul_of(const ir::Graph& g, const std::vector<ValueId>& members) {
  for (ValueId m : members)
    if (g.node(m).op == Op::matmul) return m;
  return -1;
}

/// The constants a fused kernel inlines, in node order, and its other operands (memory reads):
/// a matmul's A and B first, then what the chain reads.
struct Reads {
  std::vector<ValueId> constants, operands;
  bool matmul = false;
  /// Storage buffers the kernel binds: its operands and its result.
  int buffers() const { return static_cast<int>(operands.size()) + 1; }
};

Reads reads_of(const ir::Graph& g, ValueId root, const std::vector<ValueId>& inlined, const std::vector<bool>& inline_constant) {
  std::vector<ValueId> members = inlined;
  members.push_back(root);
  Reads r;
  const ValueId mm = matmul_of(g, members);
  for (ValueId m : members) {
    if (m == mm) continue;  // A and B are the matmul's, read by its own loads
    for (ValueId in : g.node(m).inputs) {
      if (std::find(members.begin(), members.end(), in) != members.end()) continue;
      auto& list = inline_constant[static_cast<std::size_t>(in)] ? r.constants : r.operands;
      if (std::find(list.begin(), list.end(), in) == list.end()) list.push_back(in);
    }
  }
  std::sort(r.constants.begin(), r.constants.end());
  if (mm >= 0) {
    r.matmul = true;
    r.operands.insert(r.operands.begin(), g.node(mm).inputs.begin(), g.node(mm).inputs.end());
  }
  return r;
}

/// Push-constant words of a fused kernel: elements (a reduction's kAxisPushWords, a matmul's own),
/// dims, each operand's strides, each constant. A matmul's epilogue reads each operand through
/// strides of the output's rank and takes the dims from the matmul's words.
int push_words(const Node& root, int rank, const Reads& r) {
  const int operands = static_cast<int>(r.operands.size()), constants = static_cast<int>(r.constants.size());
  if (r.matmul) return detail::matmul_push_words(rank) + rank * (operands - 2) + constants;
  return (axis_reduction(root) ? detail::kAxisPushWords : 1) + rank * (1 + operands) + constants;
}

/// The shape every node of a fused kernel is computed over (see plan_kernels).
const ir::Shape& chain_shape(const ir::Graph& g, const Node& root, const std::vector<ir::Shape>* shapes, ValueId root_id) {
  const ValueId v = axis_reduction(root) ? root.inputs[0] : root_id;
  return shapes ? (*shapes)[static_cast<std::size_t>(v)] : g.node(v).shape;
}

void verify(const ir::Graph& g, const std::vector<KernelGroup>& plan, std::int64_t view_alignment) {
  // Every value a kernel, a view or a result reads from memory is stored by an earlier kernel (or
  // is an input or a view); nodes computed inside kernels (in one, or recomputed in several)
  // are read only there.
  std::vector<int> stored_by(g.size(), -1);
  for (std::size_t k = 0; k < plan.size(); ++k) stored_by[static_cast<std::size_t>(plan[k].root)] = static_cast<int>(k);
  auto from_memory = [&](ValueId v, int k, const std::string& reader) {
    const int at = stored_by[static_cast<std::size_t>(v)];
    QKV_ASSERT(!has_kernel(g, v, view_alignment) || (at >= 0 && at < k),
               "kernel fusion: " + reader + " reads %" + std::to_string(v) + ", which no earlier kernel stores");
  };
  for (std::size_t k = 0; k < plan.size(); ++k) {
    const KernelGroup& kg = plan[k];
    std::vector<ValueId> members = kg.inlined;
    members.push_back(kg.root);
    const ValueId mm = matmul_of(g, members);
    const std::string name = "kernel %" + std::to_string(kg.root);
    for (ValueId m : members) {
      if (scalar_constant(g.node(m)) && m != kg.root) continue;
      for (ValueId in : g.node(m).inputs)
        if (m == mm || (!kg.fused() && m == kg.root) || std::find(members.begin(), members.end(), in) == members.end())
          from_memory(in, static_cast<int>(k), name);
    }
    for (ValueId in : kg.operands) from_memory(in, static_cast<int>(k), name);
  }
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!has_kernel(g, static_cast<ValueId>(i), view_alignment))
      for (ValueId in : g.nodes()[i].inputs) from_memory(in, static_cast<int>(plan.size()), "view %" + std::to_string(i));
  for (ValueId v : g.result_values()) from_memory(v, static_cast<int>(plan.size()), "the results");
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

  // Kernels are grown from roots in decreasing node order, so every reader of a candidate has
  // been placed first. A candidate whose readers are all in the kernel is computed there alone;
  // one that other kernels read too is recomputed in each (a layer norm's x - mean, read by the
  // variance's sum and by the normalisation) unless some reader cannot compute it (a matmul's
  // operand, a view's, a kernel past its limits): then it is stored, and the plan is made again
  // with it stored, until every value read from memory is some kernel's root.
  std::vector<bool> stored(n, false);
  std::vector<std::vector<ValueId>> inlined(n);
  std::vector<bool> root_of(n, false);
  for (bool again = true; again;) {
    again = false;
    for (auto& m : inlined) m.clear();
    std::fill(root_of.begin(), root_of.end(), false);
    std::vector<std::vector<ValueId>> kernels_of(n);  // the kernels computing each node inside them
    for (std::size_t i = n; i-- > 0;) {
      const Node& root = g.nodes()[i];
      if (!kernels_of[i].empty() || !has_kernel(g, static_cast<ValueId>(i), limits.view_alignment)) continue;
      const auto r = static_cast<ValueId>(i);
      root_of[i] = true;
      if (!elementwise(root) && !axis_reduction(root)) continue;
      // Every node of the kernel is computed at the same element of this shape: the root's, or a
      // reduction's input's.
      const ir::Shape& shape = elementwise(root) ? root.shape : g.node(root.inputs[0]).shape;
      auto& members = inlined[i];
      auto inside = [&](ValueId c) { return c == r || std::find(members.begin(), members.end(), c) != members.end(); };
      std::priority_queue<ValueId> candidates;
      for (ValueId in : root.inputs) candidates.push(in);
      while (!candidates.empty()) {
        const ValueId v = candidates.top();
        candidates.pop();
        const Node& node = g.node(v);
        if (inside(v) || scalar_constant(node)) continue;  // constants: placed with the kernel's reads below
        // A matmul becomes the kernel's core when it has the kernel's shape (every element of the
        // chain is one of its products) and the kernel has none yet.
        const bool epilogue = node.op == Op::matmul && elementwise(root) && node.shape == shape && matmul_of(g, members) < 0;
        if (!(elementwise(node) || epilogue) || is_result[static_cast<std::size_t>(v)] || stored[static_cast<std::size_t>(v)]) continue;
        // Read only inside this kernel (the matmul core reads its operands from memory), or an
        // elementwise node with few readers, recomputed in each of their kernels.
        const auto& rs = readers[static_cast<std::size_t>(v)];
        const bool alone = std::all_of(rs.begin(), rs.end(), [&](ValueId c) { return inside(c) && g.node(c).op != Op::matmul; });
        if (!alone && (epilogue || rs.size() > kMostRecomputingReaders)) continue;
        std::vector<ValueId> trial = members;
        trial.push_back(v);
        const Reads reads = reads_of(g, r, trial, inline_constant);
        if (push_words(root, shape.rank, reads) > kMaxPushWords || reads.buffers() > limits.storage_buffers) continue;
        members = std::move(trial);
        kernels_of[static_cast<std::size_t>(v)].push_back(r);
        if (!epilogue)
          for (ValueId in : node.inputs) candidates.push(in);
      }
    }
    // A value some node reads from memory (outside a kernel computing it) must be stored.
    auto needs_storage = [&](ValueId v) {
      const auto j = static_cast<std::size_t>(v);
      if (root_of[j] || inline_constant[j] || !has_kernel(g, v, limits.view_alignment)) return;
      stored[j] = true;
      again = true;
    };
    for (std::size_t c = 0; c < n; ++c) {
      const Node& node = g.nodes()[c];
      auto reads_in = [&](ValueId k) {  // node c's inputs, as computed in kernel k
        const auto& ms = inlined[static_cast<std::size_t>(k)];
        for (ValueId in : node.inputs)
          if (node.op == Op::matmul || std::find(ms.begin(), ms.end(), in) == ms.end()) needs_storage(in);
      };
      if (root_of[c]) reads_in(static_cast<ValueId>(c));
      for (ValueId k : kernels_of[c]) reads_in(k);
      if (!root_of[c] && kernels_of[c].empty())  // inputs, views: read in place
        for (ValueId in : node.inputs) needs_storage(in);
    }
  }
  std::vector<bool> own_kernel(n, false);
  for (std::size_t i = 0; i < n; ++i) own_kernel[i] = root_of[i] && !inline_constant[i];
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
  verify(g, plan, limits.view_alignment);
  return plan;
}

std::vector<KernelGroup> unfused_kernels(const ir::Graph& g, std::int64_t view_alignment) {
  std::vector<KernelGroup> plan;
  for (std::size_t i = 0; i < g.size(); ++i)
    if (has_kernel(g, static_cast<ValueId>(i), view_alignment)) plan.push_back({static_cast<ValueId>(i), {}, g.nodes()[i].inputs});
  return plan;
}

std::string fused_name(const ir::Graph& g, const KernelGroup& k) {
  const Node& root = g.node(k.root);
  std::string name = "fused";
  for (ValueId m : k.inlined)
    if (!scalar_constant(g.node(m))) name += "_" + std::string(ir::op_name(g.node(m).op));
  return name + "_" + std::string(ir::op_name(root.op)) + "_r" + std::to_string(chain_shape(g, root, nullptr, k.root).rank);
}

namespace {

/// The statements computing a kernel's members in node order (`members`, the matmul of an
/// epilogue excluded: its value is `acc`), each read through `value`.
template <class Value>
std::string chain_statements(const ir::Graph& g, const std::vector<ValueId>& members, Value value) {
  std::string s;
  for (ValueId m : members) {
    const Node& node = g.node(m);
    if (scalar_constant(node)) continue;
    std::string expr;
    if (node.op == Op::matmul) {
      expr = "acc";
    } else {
      std::vector<std::string> args;
      for (ValueId in : node.inputs) args.push_back(value(in));
      expr = detail::elementwise_expression(node.op, args);
    }
    s += "  float v" + std::to_string(m) + " = " + expr + ";  // %" + std::to_string(m) + " " + std::string(ir::op_name(node.op)) + "\n";
  }
  return s;
}

std::vector<ValueId> constants_of(const ir::Graph& g, const KernelGroup& k) {
  std::vector<ValueId> constants;
  for (ValueId v : k.inlined)
    if (scalar_constant(g.node(v))) constants.push_back(v);
  return constants;
}

/// A matmul with its epilogue: the matmul kernel for `target`, storing the chain's value at each
/// product. The chain reads operand k (after A and B) as x<k + 2> at o<k>: the batch entry's
/// offset e<k> (qkv_epilogue_batch) plus row and column through its strides.
KernelSource epilogue_source(const ir::Graph& g, const KernelGroup& k, ValueId mm, const Target& target) {
  const Node& mat = g.node(mm);
  const int rank = mat.shape.rank, batch_rank = rank - 2, base = detail::matmul_push_words(rank);
  const int operands = static_cast<int>(k.operands.size()) - 2;
  const std::vector<ValueId> constants = constants_of(g, k);
  auto word = [&](int w) { return "pc.p[" + std::to_string(base + w) + "]"; };
  auto stride = [&](int o, int d) { return word(o * rank + d); };
  detail::MatmulEpilogue e;
  e.operands = operands;
  std::string& s = e.glsl;
  s += "// computes " + covered_nodes(g, k) + " on each product of %" + std::to_string(mm) + "\n";
  s += "// p[" + std::to_string(base) + "..] = each operand's " + std::to_string(rank) + " strides over the output's dims, then each constant's float bits\n";
  if (operands) {
    s += "uint";
    for (int o = 0; o < operands; ++o) s += std::string(o ? "," : "") + " e" + std::to_string(o);
    s += ";  // each operand's offset at this batch entry\n";
  }
  s += "void qkv_epilogue_batch(uint batch) {\n";
  if (operands) {
    s += "  uint rem = batch;\n";
    for (int o = 0; o < operands; ++o) s += "  e" + std::to_string(o) + " = 0u;\n";
    for (int d = batch_rank - 1; d >= 0; --d) {
      const std::string dim = "pc.p[" + std::to_string(7 + d) + "]";
      s += "  { uint idx = rem % " + dim + "; rem /= " + dim + ";";
      for (int o = 0; o < operands; ++o) s += " e" + std::to_string(o) + " += idx * " + stride(o, d) + ";";
      s += " }\n";
    }
  }
  s += "}\n";
  s += "float qkv_epilogue(float acc, uint row, uint col) {\n";
  for (int o = 0; o < operands; ++o)
    s += "  uint o" + std::to_string(o) + " = e" + std::to_string(o) + " + row * " + stride(o, batch_rank) + " + col * " + stride(o, batch_rank + 1) + ";\n";
  auto value = [&](ValueId v) -> std::string {
    if (auto it = std::find(k.operands.begin() + 2, k.operands.end(), v); it != k.operands.end()) {
      const auto o = it - k.operands.begin() - 2;
      return "x" + std::to_string(o + 2) + "[o" + std::to_string(o) + "]";
    }
    if (auto it = std::find(constants.begin(), constants.end(), v); it != constants.end())
      return "uintBitsToFloat(" + word(rank * operands + static_cast<int>(it - constants.begin())) + ")";
    return "v" + std::to_string(v);
  };
  std::vector<ValueId> members = k.inlined;
  members.push_back(k.root);
  s += chain_statements(g, members, value);
  s += "  return v" + std::to_string(k.root) + ";\n}\n";
  std::vector<Op> ops;
  for (ValueId m : members)
    if (m != mm) ops.push_back(g.node(m).op);
  s = detail::math_helpers_of(ops) + s;
  for (ValueId m : members)
    if (m != mm && !scalar_constant(g.node(m))) e.name += "_" + std::string(ir::op_name(g.node(m).op));
  KernelSource source = detail::matmul_source(mat, target, &e);
  source.name = fused_name(g, k);  // as explain and profiles name it; the source says which matmul kernel
  return source;
}

}  // namespace

bool specialized(const ir::Graph& g, const KernelGroup& k) {
  return k.fused() ? matmul_of(g, k.inlined) >= 0 : specialized(g.node(k.root));
}

KernelSource fused_source(const ir::Graph& g, const KernelGroup& k, const Target& target) {
  if (const ValueId mm = matmul_of(g, k.inlined); mm >= 0) return epilogue_source(g, k, mm, target);
  const Node& root = g.node(k.root);
  const bool reduction = axis_reduction(root);
  const ValueId chain_root = reduction ? root.inputs[0] : k.root;
  QKV_ASSERT(!reduction || std::find(k.inlined.begin(), k.inlined.end(), chain_root) != k.inlined.end(), "kernel fusion: a reduction fused without its input");
  const int rank = chain_shape(g, root, nullptr, k.root).rank;
  const int operands = static_cast<int>(k.operands.size()), base = reduction ? detail::kAxisPushWords : 1;
  const std::vector<ValueId> constants = constants_of(g, k);
  std::vector<Op> ops;
  std::vector<ValueId> members = k.inlined;
  if (!reduction) members.push_back(k.root);
  for (ValueId m : members) ops.push_back(g.node(m).op);
  auto word = [&](int w) { return "pc.p[" + std::to_string(base + w) + "]"; };
  std::string s = detail::math_helpers_of(ops);  // after the header, below
  s += "// computes " + covered_nodes(g, k) + "\n";
  s += "// p[" + std::to_string(base) + "..] = the " + std::to_string(rank) + " dims of the elements below, then each operand's strides, then each constant's float bits\n";
  s += "// The value of %" + std::to_string(chain_root) + " at its element i (nodes of smaller shapes at the element they broadcast from).\n";
  s += "float qkv_chain(uint i) {\n" + detail::operand_offsets(rank, operands, base);
  auto value = [&](ValueId v) {
    if (auto it = std::find(k.operands.begin(), k.operands.end(), v); it != k.operands.end()) {
      const auto o = std::to_string(it - k.operands.begin());
      return "x" + o + "[o" + o + "]";
    }
    if (auto it = std::find(constants.begin(), constants.end(), v); it != constants.end())
      return "uintBitsToFloat(" + word(rank * (1 + operands) + static_cast<int>(it - constants.begin())) + ")";
    return "v" + std::to_string(v);
  };
  s += chain_statements(g, members, value);
  s += "  return v" + std::to_string(chain_root) + ";\n}\n";
  if (reduction) s = detail::axis_shader(detail::kernel_header(operands), s + detail::axis_body(root.op, "qkv_chain(", ")", target), target);
  else s = detail::kernel_header(operands) + s + "void main() {\n" + detail::linear_index() + "  y[i] = qkv_chain(i);\n}\n";
  return {fused_name(g, k), s, operands + 1};
}

KernelLaunch fused_launch(const ir::Graph& g, const KernelGroup& k, const std::vector<ir::Shape>& shapes, const Target& target) {
  const Node& root = g.node(k.root);
  const ValueId mm = matmul_of(g, k.inlined);
  const ir::Shape& cs = chain_shape(g, root, &shapes, k.root);
  KernelLaunch l;
  auto push_constants = [&] {
    for (ValueId v : k.inlined)
      if (scalar_constant(g.node(v))) l.push.push_back(std::bit_cast<std::uint32_t>(static_cast<float>(ir::bound_value(g, g.node(v), shapes))));
    QKV_ASSERT(static_cast<int>(l.push.size()) <= kMaxPushWords, "kernel fusion: too many push-constant words");
  };
  if (mm >= 0) {
    l = detail::matmul_launch(g.node(mm), shapes, shapes[static_cast<std::size_t>(mm)], target);
    for (std::size_t o = 2; o < k.operands.size(); ++o) {
      const auto st = detail::broadcast_strides(shapes[static_cast<std::size_t>(k.operands[o])], cs.rank);
      for (int d = 0; d < cs.rank; ++d) l.push.push_back(detail::push_word(st[static_cast<std::size_t>(d)]));
    }
    push_constants();
    return l;
  }
  if (axis_reduction(root)) {
    std::int64_t outer = 1, inner = 1;
    for (int i = 0; i < root.attrs.axis; ++i) outer *= cs[i];
    for (int i = root.attrs.axis + 1; i < cs.rank; ++i) inner *= cs[i];
    l = detail::axis_launch(outer, cs[root.attrs.axis], inner, target);
  } else {
    l.push = {detail::push_word(cs.numel())};
    l.groups = detail::elementwise_groups(cs.numel());
  }
  for (int d = 0; d < cs.rank; ++d) l.push.push_back(detail::push_word(cs[d]));
  for (ValueId in : k.operands) {
    const auto st = detail::broadcast_strides(shapes[static_cast<std::size_t>(in)], cs.rank);
    for (int d = 0; d < cs.rank; ++d) l.push.push_back(detail::push_word(st[static_cast<std::size_t>(d)]));
  }
  push_constants();
  return l;
}

std::string covered_nodes(const ir::Graph& g, const KernelGroup& k) {
  std::string s;
  for (ValueId v : k.inlined) s += "%" + std::to_string(v) + " " + std::string(ir::op_name(g.node(v).op)) + ", ";
  return s + "%" + std::to_string(k.root) + " " + std::string(ir::op_name(g.node(k.root).op));
}

}  // namespace qkv::codegen
