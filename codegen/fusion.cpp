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
//
// Reductions, three ways. A reduction's kernel takes in a reduction of the same kind over an
// adjacent axis (sum over B of a sum over N: autodiff's bias gradients), reducing both axes as
// one. A reduce_sum over all of a matmul's batch dims of A^T B (autodiff's weight gradients,
// the sum over the batch of X^T dY) is one batchless matmul whose depth runs over the batch and
// K together. And an elementwise kernel takes in sums and maxima over one axis of values of its
// own shape (kept dims): a row kernel computes each row's reductions in order, then the row's
// elements (a layer norm, forward or backward, or a softmax written by hand: one kernel).
#include "codegen/fusion.hpp"

#include <algorithm>
#include <bit>
#include <optional>
#include <queue>
#include <span>

#include "codegen/attention_glsl.hpp"
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

/// An elementwise node read by more kernels than this is stored, not recomputed in each.
constexpr std::size_t kMostRecomputingReaders = 4;

/// A constant holds one value at every element whatever its shape, so a kernel that reads it
/// (broadcast to the kernel's shape) takes that value as a push constant.
bool scalar_constant(const Node& n) { return n.op == Op::constant; }

/// A reduction a row kernel (an elementwise kernel over `shape`) can compute per row before its
/// elements: a sum or max over one axis of a value of exactly that shape, its dim kept (so it
/// broadcasts back over the row).
bool row_reduction(const ir::Graph& g, const Node& n, const ir::Shape& shape) {
  return (n.op == Op::reduce_sum || n.op == Op::reduce_max) && n.attrs.keepdim && g.node(n.inputs[0]).shape == shape;
}

/// The reductions of a row kernel among its members (an elementwise root's), in node order.
std::vector<ValueId> row_reductions(const ir::Graph& g, const Node& root, const std::vector<ValueId>& members) {
  std::vector<ValueId> r;
  if (axis_reduction(root)) return r;
  for (ValueId m : members)
    if (g.node(m).op == Op::reduce_sum || g.node(m).op == Op::reduce_max) r.push_back(m);
  std::sort(r.begin(), r.end());
  return r;
}

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

/// The push constants of a fused kernel without a matmul, declared once for its shader and its
/// launch: a reduction's or row kernel's axis_push_constants (`axis`) or its elements, the
/// chain's dims and each operand's strides over them, then each constant's value (c0, c1, ...).
PushConstants chain_push_constants(bool axis, int rank, int operands, int constants) {
  PushConstants p = axis ? detail::axis_push_constants() : PushConstants{};
  if (!axis) p.scalar("elements", PushConstants::Type::u32, "the chain's elements");
  detail::declare_operand_strides(p, rank, operands);
  for (int c = 0; c < constants; ++c) p.scalar("c" + std::to_string(c), PushConstants::Type::f32, "a constant it computes with");
  return p;
}

/// The push constants of a matmul's epilogue, after the matmul's: each of its operands' strides
/// over the output's `rank` dims (x2_strides, ...), then each constant's value (c0, c1, ...).
PushConstants epilogue_push_constants(int rank, int operands, int constants) {
  PushConstants p;
  for (int o = 0; o < operands; ++o) p.array(detail::strides_name(o + 2), rank, "x" + std::to_string(o + 2) + "'s strides over the output's dims");
  for (int c = 0; c < constants; ++c) p.scalar("c" + std::to_string(c), PushConstants::Type::f32, "a constant it computes with");
  return p;
}

/// Push-constant words of a fused kernel. A matmul's epilogue reads each operand through strides
/// of the output's rank and takes the dims from the matmul's words.
int push_words(const Node& root, int rank, const Reads& r, bool rows) {
  const int operands = static_cast<int>(r.operands.size()), constants = static_cast<int>(r.constants.size());
  if (r.matmul && axis_reduction(root)) return detail::matmul_push_words(2);  // summed over its batch (sums_batches)
  if (r.matmul) return detail::matmul_push_words(rank) + epilogue_push_constants(rank, operands - 2, constants).words();
  return chain_push_constants(axis_reduction(root) || rows, rank, operands, constants).words();
}

/// What a reduction kernel reduces: the input of its deepest reduction and the range of that
/// input's axes [first, last] reduced. A reduce_sum (or reduce_max) of one over an adjacent axis
/// is merged into the same kernel (autodiff's bias gradients sum over B, then over N): the two
/// axes are one axis of their product, since the layout is contiguous.
struct Reduced {
  ValueId input;
  int first, last;
};

/// The axes reduction `inner` (over axis b, keepdim or not) reduces together with the range
/// [first, last] of its result's axes reduced after it, in its input's axes; nullopt when they
/// are not one contiguous range.
std::optional<std::pair<int, int>> merged_axes(const Node& inner, int first, int last) {
  const int b = inner.attrs.axis;
  if (!inner.attrs.keepdim) {  // the result lost axis b: the axes from b on move up by one
    if (first >= b) ++first;
    if (last >= b) ++last;
  }
  if (b < first - 1 || b > last + 1) return std::nullopt;
  return std::pair{std::min(first, b), std::max(last, b)};
}

Reduced reduced_of(const ir::Graph& g, ValueId root, const std::vector<ValueId>& members) {
  const Node& r = g.node(root);
  Reduced d{r.inputs[0], r.attrs.axis, r.attrs.axis};
  while (std::find(members.begin(), members.end(), d.input) != members.end() && g.node(d.input).op == r.op) {
    const Node& inner = g.node(d.input);
    const auto axes = merged_axes(inner, d.first, d.last);
    QKV_ASSERT(axes.has_value(), "kernel fusion: merged reductions over axes that are not adjacent");
    d = {inner.inputs[0], axes->first, axes->second};
  }
  return d;
}

/// The axis of the reduced input's shape each reduction of a merged kernel reduces, the deepest
/// (first applied) first; one entry when nothing is merged.
std::vector<int> sum_order(const ir::Graph& g, ValueId root, const std::vector<ValueId>& members) {
  const Node& r = g.node(root);
  std::vector<int> axes{r.attrs.axis};  // the root's first, in its input's axes
  ValueId input = r.inputs[0];
  while (std::find(members.begin(), members.end(), input) != members.end() && g.node(input).op == r.op) {
    const Node& inner = g.node(input);
    if (!inner.attrs.keepdim)  // the axes from inner's on move up by one in inner's input
      for (int& a : axes) a += a >= inner.attrs.axis ? 1 : 0;
    axes.push_back(inner.attrs.axis);
    input = inner.inputs[0];
  }
  std::reverse(axes.begin(), axes.end());
  return axes;
}

/// Whether reduction kernel `root` (whose members so far are `members`) can take node `v` in:
/// v is the reduction of the same kind it reads, over an axis next to those it reduces.
bool merges_reduction(const ir::Graph& g, ValueId root, const std::vector<ValueId>& members, ValueId v) {
  const Node& r = g.node(root);
  if (r.op == Op::softmax || g.node(v).op != r.op) return false;
  const Reduced d = reduced_of(g, root, members);
  return d.input == v && merged_axes(g.node(v), d.first, d.last).has_value();
}

/// Whether a reduce_sum over `reduced`'s range of axes of matmul `v` sums exactly its batch dims
/// and the matmul is A^T B with both operands over all of them: then the sum is one matmul whose
/// depth runs over batch and K together (A as [batch K, M], B as [batch K, N], contiguous), as
/// autodiff's weight gradients are (dW = sum over the batch of X^T dY).
bool sums_batches(const ir::Graph& g, ValueId v, const Reduced& reduced) {
  const Node& mm = g.node(v);
  if (mm.op != Op::matmul || !mm.attrs.transpose_a || mm.attrs.transpose_b || mm.shape.rank < 3) return false;
  if (reduced.input != v || reduced.first != 0 || reduced.last != mm.shape.rank - 3) return false;
  for (ValueId in : mm.inputs) {
    const ir::Shape& s = g.node(in).shape;
    if (s.rank != mm.shape.rank) return false;
    for (int d = 0; d + 2 < s.rank; ++d)
      if (s[d] != mm.shape[d]) return false;
  }
  return true;
}

/// The value whose elements a fused kernel computes its chain at: the root's, or what its
/// reductions reduce.
ValueId chain_value(const ir::Graph& g, ValueId root, const std::vector<ValueId>& members) {
  return axis_reduction(g.node(root)) ? reduced_of(g, root, members).input : root;
}

/// The shape every node of a fused kernel is computed over (see plan_kernels).
const ir::Shape& chain_shape(const ir::Graph& g, const KernelGroup& k, const std::vector<ir::Shape>* shapes) {
  const ValueId v = chain_value(g, k.root, k.inlined);
  return shapes ? (*shapes)[static_cast<std::size_t>(v)] : g.node(v).shape;
}

void verify(const ir::Graph& g, const ir::StoragePlan& storage, const std::vector<KernelGroup>& plan) {
  // Every value a kernel, a view or a result reads from memory is stored by an earlier kernel (or
  // is an input or a view); nodes computed inside kernels (in one, or recomputed in several)
  // are read only there.
  std::vector<int> stored_by(g.size(), -1);
  for (std::size_t k = 0; k < plan.size(); ++k)
    for (ValueId v : {plan[k].root, plan[k].beside})
      if (v >= 0) stored_by[static_cast<std::size_t>(v)] = static_cast<int>(k);
  auto from_memory = [&](ValueId v, int k, const std::string& reader) {
    const int at = stored_by[static_cast<std::size_t>(v)];
    QKV_ASSERT(!storage.has_kernel(v) || (at >= 0 && at < k),
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
    if (!storage.has_kernel(static_cast<ValueId>(i)))
      for (ValueId in : g.nodes()[i].inputs) from_memory(in, static_cast<int>(plan.size()), "view %" + std::to_string(i));
  for (ValueId v : g.result_values()) from_memory(v, static_cast<int>(plan.size()), "the results");
}

/// Whether each value is a constant that only elementwise nodes read (and no result): computed
/// inside the kernels that read it, from a push constant.
std::vector<bool> inlined_constants(const ir::Graph& g, const std::vector<std::vector<ValueId>>& readers, const std::vector<bool>& is_result) {
  std::vector<bool> inline_constant(g.size(), false);
  for (std::size_t i = 0; i < g.size(); ++i)
    inline_constant[i] = scalar_constant(g.nodes()[i]) && !is_result[i] && !readers[i].empty() &&
                         std::all_of(readers[i].begin(), readers[i].end(), [&](ValueId c) { return elementwise(g, g.node(c)); });
  return inline_constant;
}

/// What the kernel of node v alone reads: its operands, a flash kernel's paged keys and values as
/// their pages and block tables (detail::attention_operands).
std::vector<ValueId> own_operands(const ir::Graph& g, const ir::StoragePlan& storage, ValueId v) {
  return ir::is_fused_attention(g.node(v).op) ? detail::attention_operands(g, storage, v) : g.node(v).inputs;
}

/// The kernels, in node order, of the roots (`root_of`, but the constants computed where they are
/// read) and the nodes each computes inside (`inlined`): each with the constants it computes too,
/// and the values it reads from memory.
std::vector<KernelGroup> kernel_groups(const ir::Graph& g, const ir::StoragePlan& storage, const std::vector<bool>& root_of,
                                       const std::vector<std::vector<ValueId>>& inlined, const std::vector<bool>& inline_constant) {
  const std::size_t n = g.size();
  std::vector<bool> own_kernel(n, false);
  for (std::size_t i = 0; i < n; ++i) own_kernel[i] = root_of[i] && !inline_constant[i];
  std::vector<KernelGroup> plan;
  for (std::size_t i = 0; i < n; ++i) {
    if (!own_kernel[i] || written_by_tangent(g, storage, static_cast<ValueId>(i)) >= 0) continue;
    KernelGroup k;
    k.root = static_cast<ValueId>(i);
    k.beside = forward_beside(g, storage, k.root);
    k.inlined = inlined[i];
    std::sort(k.inlined.begin(), k.inlined.end());
    const Node& root = g.nodes()[i];
    if (elementwise(g, root) || k.fused()) {
      // The constants it reads without a kernel of their own are computed inside it too.
      const Reads reads = reads_of(g, k.root, k.inlined, inline_constant);
      k.inlined.insert(k.inlined.end(), reads.constants.begin(), reads.constants.end());
      std::sort(k.inlined.begin(), k.inlined.end());
      if (k.fused()) k.operands = reads.operands;
    }
    if (!k.fused()) k.operands = own_operands(g, storage, k.root);
    plan.push_back(std::move(k));
  }
  return plan;
}

}  // namespace

std::vector<KernelGroup> plan_kernels(const ir::Graph& g, const ir::StoragePlan& storage, const FusionLimits& limits) {
  const std::size_t n = g.size();
  std::vector<std::vector<ValueId>> readers(n);
  for (std::size_t i = 0; i < n; ++i)
    for (ValueId in : g.nodes()[i].inputs) readers[static_cast<std::size_t>(in)].push_back(static_cast<ValueId>(i));
  std::vector<bool> is_result(n, false);
  for (ValueId v : g.result_values()) is_result[static_cast<std::size_t>(v)] = true;

  // Constants read only by elementwise nodes are inlined where they are read (as push constants).
  const std::vector<bool> inline_constant = inlined_constants(g, readers, is_result);

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
      if (!kernels_of[i].empty() || !storage.has_kernel(static_cast<ValueId>(i))) continue;
      const auto r = static_cast<ValueId>(i);
      root_of[i] = true;
      if (!elementwise(g, root) && !axis_reduction(root)) continue;
      // Every node of the kernel is computed at the same element of one shape: the root's, or
      // what its reductions reduce.
      auto& members = inlined[i];
      const ir::Shape& root_shape = elementwise(g, root) ? root.shape : g.node(root.inputs[0]).shape;
      auto inside = [&](ValueId c) { return c == r || std::find(members.begin(), members.end(), c) != members.end(); };
      std::priority_queue<ValueId> candidates;
      for (ValueId in : root.inputs) candidates.push(in);
      while (!candidates.empty()) {
        const ValueId v = candidates.top();
        candidates.pop();
        const Node& node = g.node(v);
        if (inside(v) || scalar_constant(node)) continue;  // constants: placed with the kernel's reads below
        if (!storage.has_kernel(v)) continue;              // a view (an exact round too): read in place
        // A matmul becomes the kernel's core when it has the kernel's shape (every element of the
        // chain is one of its products) and the kernel has none yet.
        const std::vector<ValueId> reductions = row_reductions(g, root, members);
        const bool epilogue =
            node.op == Op::matmul && elementwise(g, root) && node.shape == root_shape && matmul_of(g, members) < 0 && reductions.empty();
        // A row kernel: an elementwise kernel that computes sums or maxima over its rows first
        // (a layer norm's mean and variance, then its normalised elements).
        const bool row = elementwise(g, root) && matmul_of(g, members) < 0 && row_reduction(g, node, root_shape) &&
                         (reductions.empty() || g.node(reductions.front()).attrs.axis == node.attrs.axis);
        const bool merged = axis_reduction(root) && merges_reduction(g, r, members, v);
        // A reduce_sum over a matmul's batch dims: one matmul over the batch and K together.
        const bool summed = root.op == Op::reduce_sum && matmul_of(g, members) < 0 && sums_batches(g, v, reduced_of(g, r, members));
        if (!(elementwise(g, node) || epilogue || merged || summed || row) || is_result[static_cast<std::size_t>(v)] ||
            stored[static_cast<std::size_t>(v)])
          continue;
        // Read only inside this kernel (the matmul core reads its operands from memory), or an
        // elementwise node with few readers, recomputed in each of their kernels.
        const auto& rs = readers[static_cast<std::size_t>(v)];
        const bool alone = std::all_of(rs.begin(), rs.end(), [&](ValueId c) { return inside(c) && g.node(c).op != Op::matmul; });
        if (!alone && (epilogue || merged || summed || row || rs.size() > kMostRecomputingReaders)) continue;
        std::vector<ValueId> trial = members;
        trial.push_back(v);
        const Reads reads = reads_of(g, r, trial, inline_constant);
        const int rank = g.node(chain_value(g, r, trial)).shape.rank;
        const bool rows = !row_reductions(g, root, trial).empty();
        if (push_words(root, rank, reads, rows) > kMaxPushWords || reads.buffers() > limits.storage_buffers) continue;
        members = std::move(trial);
        kernels_of[static_cast<std::size_t>(v)].push_back(r);
        if (!epilogue && !summed)
          for (ValueId in : node.inputs) candidates.push(in);
      }
    }
    // A value some node reads from memory (outside a kernel computing it) must be stored.
    auto needs_storage = [&](ValueId v) {
      const auto j = static_cast<std::size_t>(v);
      if (root_of[j] || inline_constant[j] || !storage.has_kernel(v)) return;
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
  std::vector<KernelGroup> plan = kernel_groups(g, storage, root_of, inlined, inline_constant);
  verify(g, storage, plan);
  return plan;
}

std::vector<KernelGroup> unfused_kernels(const ir::Graph& g, const ir::StoragePlan& storage) {
  std::vector<KernelGroup> plan;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto v = static_cast<ValueId>(i);
    if (storage.has_kernel(v) && written_by_tangent(g, storage, v) < 0)
      plan.push_back({v, {}, own_operands(g, storage, v), forward_beside(g, storage, v)});
  }
  return plan;
}

std::string fused_name(const ir::Graph& g, const ir::StoragePlan& storage, const KernelGroup& k, const Target& target) {
  const Node& root = g.node(k.root);
  std::string name = "fused";
  for (ValueId m : k.inlined) {
    if (scalar_constant(g.node(m))) continue;
    if (g.node(m).op != Op::matmul) {
      name += "_" + std::string(ir::op_name(g.node(m).op));
      continue;
    }
    // An epilogue's matmul: which kernel multiplies (cooperative matrices, lanes or tiles).
    detail::MatmulDtypes dtypes = detail::matmul_dtypes(g, storage, m, false);
    dtypes.out = storage.held(k.root);
    name += "_" + detail::matmul_family(target, dtypes);
  }
  return name + "_" + std::string(ir::op_name(root.op)) + "_r" + std::to_string(chain_shape(g, k, nullptr).rank);
}

namespace {

/// The statements computing a kernel's members in node order (`members`, the matmul of an
/// epilogue excluded: its value is `acc`), each read through `value`.
template <class Value> std::string chain_statements(const ir::Graph& g, const std::vector<ValueId>& members, Value value) {
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
KernelSource epilogue_source(const ir::Graph& g, const ir::StoragePlan& storage, const KernelGroup& k, ValueId mm, const Target& target) {
  const Node& mat = g.node(mm);
  const int rank = mat.shape.rank, batch_rank = rank - 2;
  const int operands = static_cast<int>(k.operands.size()) - 2;
  const std::vector<ValueId> constants = constants_of(g, k);
  auto stride = [&](int o, int d) { return "pc." + detail::strides_name(o + 2) + "[" + std::to_string(d) + "]"; };
  detail::MatmulEpilogue e;
  e.operands = operands;
  e.push = epilogue_push_constants(rank, operands, static_cast<int>(constants.size()));
  for (auto it = k.operands.begin() + 2; it != k.operands.end(); ++it) e.held.push_back(storage.held(*it));
  std::string& s = e.glsl;
  s += "// computes " + covered_nodes(g, k) + " on each product of %" + std::to_string(mm) + "\n";
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
      const std::string dim = "pc.batch[" + std::to_string(d) + "]";
      s += "  { uint idx = rem % " + dim + "; rem /= " + dim + ";";
      for (int o = 0; o < operands; ++o) s += " e" + std::to_string(o) + " += idx * " + stride(o, d) + ";";
      s += " }\n";
    }
  }
  s += "}\n";
  s += "float qkv_epilogue(float acc, uint row, uint col) {\n";
  for (int o = 0; o < operands; ++o)
    s += "  uint o" + std::to_string(o) + " = e" + std::to_string(o) + " + row * " + stride(o, batch_rank) + " + col * " + stride(o, batch_rank + 1) +
         ";\n";
  auto value = [&](ValueId v) -> std::string {
    if (auto it = std::find(k.operands.begin() + 2, k.operands.end(), v); it != k.operands.end()) {
      const auto o = it - k.operands.begin() - 2;
      return detail::widened(storage.held(*it), "x" + std::to_string(o + 2) + "[o" + std::to_string(o) + "]");
    }
    if (auto it = std::find(constants.begin(), constants.end(), v); it != constants.end()) return "pc.c" + std::to_string(it - constants.begin());
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
  detail::MatmulDtypes dtypes = detail::matmul_dtypes(g, storage, mm, false);
  dtypes.out = storage.held(k.root);  // the chain's value, narrowed where its cast's storage is 16-bit
  KernelSource source = detail::matmul_source(mat, target, dtypes, &e);
  source.name = fused_name(g, storage, k, target);  // as explain and profiles name it
  return source;
}

/// The matmul a reduce_sum over its batch dims is (sums_batches), as a batchless matmul whose
/// depth is batch * K (batch_summed_launch).
ir::Node batch_summed_matmul(const ir::Graph& g, ValueId mm) {
  ir::Node flat = g.node(mm);
  flat.inputs = {0, 1};  // the shapes batch_summed_launch passes
  flat.shape = ir::Shape{flat.shape.back(1), flat.shape.back(0)};
  return flat;
}

KernelSource batch_summed_source(const ir::Graph& g, const ir::StoragePlan& storage, const KernelGroup& k, ValueId mm, const Target& target) {
  // Its sums stored rounded where a round is the sum's only reader (the storage plan's `rounded`).
  const DType rounded = storage[k.root].rounded;
  detail::MatmulEpilogue round;
  if (is_half(rounded)) {
    round.name = detail::Store{rounded}.suffix();
    round.glsl = detail::math_helpers_of({rounded == DType::f16 ? Op::round_f16 : Op::round_bf16}) +
                 "void qkv_epilogue_batch(uint batch) {}\nfloat qkv_epilogue(float acc, uint row, uint col) { return " +
                 detail::rounded_value(rounded, "acc") + "; }\n";
  }
  KernelSource source =
      detail::matmul_source(batch_summed_matmul(g, mm), target, detail::matmul_dtypes(g, storage, mm, false), is_half(rounded) ? &round : nullptr);
  const std::size_t line = source.glsl.find('\n') + 1;  // after #version
  source.glsl.insert(line, "// computes " + covered_nodes(g, k) + ": the sum over %" + std::to_string(mm) +
                               "'s batch is one matmul whose depth runs over the batch and K together\n");
  source.name = fused_name(g, storage, k, target) + round.name;
  return source;
}

KernelLaunch batch_summed_launch(const ir::Graph& g, const ir::StoragePlan& storage, ValueId mm, const std::vector<ir::Shape>& shapes,
                                 const Target& target) {
  const Node& mat = g.node(mm);
  const ir::Shape& as = shapes[static_cast<std::size_t>(mat.inputs[0])];  // [batch.., K, M]
  const ir::Shape& bs = shapes[static_cast<std::size_t>(mat.inputs[1])];  // [batch.., K, N]
  std::int64_t depth = as.back(1);
  for (int d = 0; d + 2 < as.rank; ++d) depth *= as[d];
  const std::vector<ir::Shape> flat = {ir::Shape{depth, as.back(0)}, ir::Shape{depth, bs.back(0)}};
  return detail::matmul_launch(batch_summed_matmul(g, mm), flat, ir::Shape{as.back(0), bs.back(0)}, target,
                               detail::matmul_dtypes(g, storage, mm, false));
}

}  // namespace

bool specialized(const ir::Graph& g, const KernelGroup& k) { return k.fused() ? matmul_of(g, k.inlined) >= 0 : specialized(g.node(k.root)); }

KernelSource fused_source(const ir::Graph& g, const ir::StoragePlan& storage, const KernelGroup& k, const Target& target) {
  if (const ValueId mm = matmul_of(g, k.inlined); mm >= 0)
    return axis_reduction(g.node(k.root)) ? batch_summed_source(g, storage, k, mm, target) : epilogue_source(g, storage, k, mm, target);
  const Node& root = g.node(k.root);
  const bool reduction = axis_reduction(root);
  const std::vector<ValueId> reductions = row_reductions(g, root, k.inlined);
  const ValueId chain_root = chain_value(g, k.root, k.inlined);
  const int rank = chain_shape(g, k, nullptr).rank;
  const int operands = static_cast<int>(k.operands.size());
  const std::vector<ValueId> constants = constants_of(g, k);
  const PushConstants push = chain_push_constants(reduction || !reductions.empty(), rank, operands, static_cast<int>(constants.size()));
  auto reduced = [&](ValueId m) { return std::find(reductions.begin(), reductions.end(), m) != reductions.end(); };
  std::vector<Op> ops;
  std::vector<ValueId> members;  // the chain's nodes: not the reductions merged into the root, nor a row kernel's
  for (ValueId m : k.inlined)
    if ((!reduction || g.node(m).op != root.op) && !reduced(m)) members.push_back(m);
  if (!reduction) members.push_back(k.root);
  for (ValueId m : members) ops.push_back(g.node(m).op);
  // A reduction whose only reader is a round stores its values rounded (the storage plan's `rounded`); a
  // root whose only reader is a cast to f16 or bf16 stores them in the cast's 16-bit storage
  // (a narrowed cast), and 16-bit inputs are read where they are (half views).
  const detail::Store store{reduction ? storage[k.root].rounded : DType::f32, storage.held(k.root)};
  for (Op round : store.rounds()) ops.push_back(round);
  std::vector<DType> held;
  for (ValueId o : k.operands) held.push_back(storage.held(o));
  std::string s = detail::math_helpers_of(ops);  // after the header, below
  s += "// computes " + covered_nodes(g, k) + "\n";
  auto value = [&](ValueId v) {
    if (auto it = std::find(k.operands.begin(), k.operands.end(), v); it != k.operands.end()) {
      const auto o = std::to_string(it - k.operands.begin());
      return detail::widened(held[static_cast<std::size_t>(it - k.operands.begin())], "x" + o + "[o" + o + "]");
    }
    if (auto it = std::find(constants.begin(), constants.end(), v); it != constants.end()) return "pc.c" + std::to_string(it - constants.begin());
    return (reduced(v) ? "r" : "v") + std::to_string(v);
  };
  // A function of element i computing `result` from the members it depends on (a row kernel's
  // reductions are its row's values, computed before).
  auto function = [&](const std::string& name, ValueId result) {
    std::vector<bool> needed(g.size(), false);
    needed[static_cast<std::size_t>(result)] = true;
    for (auto it = members.rbegin(); it != members.rend(); ++it)
      if (needed[static_cast<std::size_t>(*it)])
        for (ValueId in : g.node(*it).inputs) needed[static_cast<std::size_t>(in)] = true;
    std::vector<ValueId> used;
    for (ValueId m : members)
      if (needed[static_cast<std::size_t>(m)]) used.push_back(m);
    return "float " + name + "(uint i) {\n" + detail::operand_offsets(rank, operands) + chain_statements(g, used, value) + "  return " +
           value(result) + ";\n}\n";
  };
  std::vector<detail::RowReduction> rows;
  for (ValueId r : reductions) {
    const std::string id = std::to_string(r);
    s += "float r" + id + ";  // %" + id + " " + std::string(ir::op_name(g.node(r).op)) + ": its row's value\n";
    s += function("qkv_in" + id, g.node(r).inputs[0]);
    rows.push_back({g.node(r).op, "r" + id, "qkv_in" + id});
  }
  s += "// The value of %" + std::to_string(chain_root) + " at its element i (nodes of smaller shapes at the element they broadcast from).\n";
  s += function("qkv_chain", chain_root);
  if (reduction) {
    // Sums merged over several axes add in the order the separate sums did.
    const std::vector<int> order = root.op == Op::reduce_sum ? sum_order(g, k.root, k.inlined) : std::vector<int>{};
    s = detail::axis_shader(detail::kernel_header(held, store.held, push, target),
                            s + detail::axis_body(root.op, "qkv_chain(", ")", target, order, store), target);
  } else if (!rows.empty()) {
    s = detail::axis_shader(detail::kernel_header(held, store.held, push, target), s + detail::row_body(rows, "qkv_chain", target, store), target);
  } else {
    s = detail::kernel_header(held, store.held, push, target) + s + "void main() {\n" + detail::linear_index() + "  y[i] = " + store("qkv_chain(i)") +
        ";\n}\n";
  }
  KernelSource source{fused_name(g, storage, k, target) + store.suffix(held), s, operands + 1};
  source.push_signature = push.signature();
  return source;
}

KernelLaunch fused_launch(const ir::Graph& g, const ir::StoragePlan& storage, const KernelGroup& k, const std::vector<ir::Shape>& shapes,
                          const Target& target) {
  const Node& root = g.node(k.root);
  const ValueId mm = matmul_of(g, k.inlined);
  const ir::Shape& cs = chain_shape(g, k, &shapes);
  KernelLaunch l;
  const std::vector<ValueId> constants = constants_of(g, k);
  auto set_constants = [&](PushConstants::Values& push) {
    for (std::size_t c = 0; c < constants.size(); ++c) push.set_float("c" + std::to_string(c), ir::bound_value(g, g.node(constants[c]), shapes));
  };
  if (mm >= 0 && axis_reduction(root)) return batch_summed_launch(g, storage, mm, shapes, target);
  if (mm >= 0) {
    const int operands = static_cast<int>(k.operands.size()) - 2;
    const PushConstants epilogue = epilogue_push_constants(cs.rank, operands, static_cast<int>(constants.size()));
    return detail::matmul_launch(g.node(mm), shapes, shapes[static_cast<std::size_t>(mm)], target, detail::matmul_dtypes(g, storage, mm, false),
                                 &epilogue, [&](PushConstants::Values& push) {
                                   for (int o = 0; o < operands; ++o) {
                                     const auto st = detail::broadcast_strides(
                                         shapes[static_cast<std::size_t>(k.operands[static_cast<std::size_t>(o + 2)])], cs.rank);
                                     push.set_array(detail::strides_name(o + 2), std::span(st.data(), static_cast<std::size_t>(cs.rank)));
                                   }
                                   set_constants(push);
                                 });
  }
  const std::vector<ValueId> rows = row_reductions(g, root, k.inlined);
  const PushConstants declaration =
      chain_push_constants(!rows.empty() || axis_reduction(root), cs.rank, static_cast<int>(k.operands.size()), static_cast<int>(constants.size()));
  PushConstants::Values push = declaration.values();
  if (!rows.empty()) {
    const int axis = g.node(rows.front()).attrs.axis;
    std::int64_t outer = 1, inner = 1;
    for (int i = 0; i < cs.rank; ++i) (i < axis ? outer : inner) *= i == axis ? 1 : cs[i];
    l = detail::axis_launch(outer, cs[axis], inner, target, push);
  } else if (axis_reduction(root)) {
    const Reduced d = reduced_of(g, k.root, k.inlined);
    std::int64_t outer = 1, axis = 1, inner = 1;
    for (int i = 0; i < cs.rank; ++i) (i < d.first ? outer : i <= d.last ? axis : inner) *= cs[i];
    l = detail::axis_launch(outer, axis, inner, target, push);
  } else {
    push.set("elements", detail::push_word(cs.numel()));
    l.groups = detail::elementwise_groups(cs.numel(), target);
  }
  std::vector<ir::Shape> read;
  for (ValueId in : k.operands) read.push_back(shapes[static_cast<std::size_t>(in)]);
  detail::set_operand_strides(push, cs, read);
  set_constants(push);
  l.push = push.words();
  l.push_signature = declaration.signature();
  return l;
}

std::string covered_nodes(const ir::Graph& g, const KernelGroup& k) {
  std::string s;
  for (ValueId v : k.inlined) s += "%" + std::to_string(v) + " " + std::string(ir::op_name(g.node(v).op)) + ", ";
  return s + "%" + std::to_string(k.root) + " " + std::string(ir::op_name(g.node(k.root).op));
}

}  // namespace qkv::codegen
