// The CPU backend's executable: a memory plan per input shapes, then one kernel call per node.
#include "backends/cpu/cpu_backend.hpp"

#include <cblas.h>

#include <cstring>

#include "backends/cpu/attention.hpp"
#include "backends/cpu/isa.hpp"
#include "backends/cpu/kernels.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/executable_skeleton.hpp"
#include "backends/half_precision.hpp"
#include "backends/host_kernels.hpp"
#include "ir/passes/memory_plan.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/region.hpp"

namespace qkv::backend {

namespace {

using ir::Node;
using ir::Op;

/// Nodes one kernel computes together when they are adjacent: attention and the attention_lse
/// of its operands (placed next to it by the pipeline), and attention's gradients with respect
/// to q, k and v (three nodes with the same operands, emitted together by autodiff). Indexed by
/// the group's first node (its leader): the group's nodes; empty for the others.
std::vector<std::vector<std::size_t>> kernel_groups(const ir::Graph& g) {
  std::vector<std::vector<std::size_t>> group(g.size());
  std::vector<bool> member(g.size(), false);
  for (std::size_t i = 0; i + 1 < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op != Op::attention && n.op != Op::masked_attention && n.op != Op::flex_attention) continue;
    const Node& s = g.nodes()[i + 1];
    const ir::LseCall lse = ir::lse_of(n);
    if (s.op != lse.op || s.inputs != lse.inputs || !(s.attrs == lse.attrs) || !ir::same_region(s.region.get(), n.region.get())) continue;
    group[i] = {i, i + 1};
    member[i + 1] = true;
  }
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    if ((n.op != Op::attention_grad && n.op != Op::masked_attention_grad && n.op != Op::flex_attention_grad) || n.attrs.wrt > 2 || member[i])
      continue;
    std::vector<std::size_t> members = {i};
    for (std::size_t j = i + 1; j < g.size() && members.size() < 3; ++j) {
      const Node& s = g.nodes()[j];
      ir::Attrs same = s.attrs;
      same.wrt = n.attrs.wrt;
      if (s.op != n.op || s.inputs != n.inputs || !(same == n.attrs) || s.attrs.wrt > 2 || !ir::same_region(s.region.get(), n.region.get())) break;
      members.push_back(j);
      member[j] = true;
    }
    if (members.size() > 1) group[i] = std::move(members);
  }
  return group;
}

class CpuExecutable final : public ExecutableSkeleton {
 public:
  explicit CpuExecutable(ir::Graph g) : ExecutableSkeleton(std::move(g)), slot_(graph_.size(), -1) {
    for (std::size_t i = 0; i < input_ids_.size(); ++i) slot_[static_cast<std::size_t>(input_ids_[i])] = static_cast<int>(i);
    find_kernel_groups();
  }
  std::int64_t planned_bytes() const override { return memory_.total_bytes; }
  std::vector<TileCount> tile_counts() const override { return tile_counts_; }

  void set_state(const TensorMap& tensors) override {
    check_state_names(graph_, tensors);
    state_ = tensors;  // read in place by the next runs; their shapes are part of the plan's signature
  }
  TensorMap state() override { return state_; }

  void compute() override {
    tile_counts_.clear();
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      if (!computed_with_leader(i)) {
        tiles_.computed = 0;
        tiles_.skipped = 0;
        tiles_.unmasked = 0;
        execute(i);
        if (ir::is_fused_attention(graph_.nodes()[i].op))
          tile_counts_.push_back({static_cast<ir::ValueId>(i), tiles_.computed.load(), tiles_.skipped.load(), tiles_.unmasked.load()});
      }
      computed(static_cast<ir::ValueId>(i));  // a group's later members: by their leader's kernel
    }
    // Updates write back into the held tensors once every kernel has read the old values.
    for (const auto& [name, v] : graph_.updates()) {
      const float* src = value_ptr(static_cast<std::size_t>(v));
      Tensor& held = state_.at(name);
      if (src != held.data<float>() && held.nbytes()) std::memcpy(held.data<float>(), src, held.nbytes());
    }
  }
  Tensor output(std::string_view, ir::ValueId v) override { return f32_output(v, value_ptr(static_cast<std::size_t>(v))); }

 private:
  void plan() override {
    bind_shapes();
    std::vector<std::int64_t> bytes(graph_.size());
    for (std::size_t i = 0; i < graph_.size(); ++i) bytes[i] = shapes_[i].numel() * static_cast<std::int64_t>(sizeof(float));
    // f32 inputs are read where the caller keeps them; bool and i32 inputs are widened into the arena.
    memory_ = ir::plan_memory(
        graph_, bytes, [](const Node& n) { return n.op == Op::input && n.dtype == DType::f32; }, 64);
    plan_kernel_groups();
    try {
      arena_.assign(static_cast<std::size_t>(memory_.total_bytes / 4 + 16), 0.0f);
    } catch (const std::bad_alloc&) {
      std::size_t largest = 0;
      for (std::size_t i = 1; i < bytes.size(); ++i)
        if (bytes[i] > bytes[largest]) largest = i;
      throw ResourceError("cpu: out of memory: the plan for these shapes needs " + std::to_string(memory_.total_bytes) +
                          " bytes; the largest value is %" + std::to_string(largest) + " " + std::string(ir::op_name(graph_.nodes()[largest].op)) +
                          " " + graph_.type_string(graph_.nodes()[largest].dtype, shapes_[largest]) + " (" + std::to_string(bytes[largest]) +
                          " bytes)");
    }
  }

  const Tensor& input_tensor(std::size_t v) const { return *tensors_[static_cast<std::size_t>(slot_[v])]; }
  const float* value_ptr(std::size_t v) const {
    auto root = static_cast<std::size_t>(memory_.storage_of[v]);
    if (memory_.offset[root] < 0) return input_tensor(root).data<float>();
    return arena_.data() + memory_.offset[root] / 4;
  }
  float* out_ptr(std::size_t v) { return arena_.data() + memory_.offset[v] / 4; }

  void find_kernel_groups() {
    group_ = kernel_groups(graph_);
    leader_.assign(graph_.size(), -1);
    for (std::size_t i = 0; i < graph_.size(); ++i)
      for (std::size_t j = 1; j < group_[i].size(); ++j) leader_[group_[i][j]] = static_cast<ir::ValueId>(i);
  }

  /// Whether each group runs as one kernel for the planned shapes: only if the plan gave its
  /// outputs bytes apart from each other and from every operand the leader reads (the plan may
  /// reuse an operand that only the leader reads, such as attention's v, for a later member's
  /// output; checked, not assumed), and for gradients only with a batch entry per thread at least
  /// (the joint kernel's unit of work).
  void plan_kernel_groups() {
    group_fused_.assign(graph_.size(), false);
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      if (group_[i].empty()) continue;
      bool ok = true;
      const Node& n = graph_.nodes()[i];
      if (n.op == Op::attention_grad || n.op == Op::masked_attention_grad) {
        const ir::Shape& dy = shapes_[static_cast<std::size_t>(n.inputs[3])];
        std::int64_t batches = 1;
        for (int d = 0; d + 2 < dy.rank; ++d) batches *= dy[d];
        ok = batches >= static_cast<std::int64_t>(cpu::ThreadPool::global().size());
      }
      // Byte ranges in the arena (empty for values read where the caller keeps them).
      auto bytes_of = [&](std::size_t v) {
        const auto root = static_cast<std::size_t>(memory_.storage_of[v]);
        const std::int64_t at = memory_.offset[root];
        return std::pair<std::int64_t, std::int64_t>{at, at < 0 ? at : at + shapes_[root].numel() * 4};
      };
      auto apart = [](std::pair<std::int64_t, std::int64_t> a, std::pair<std::int64_t, std::int64_t> b) {
        return a.first < 0 || b.first < 0 || a.second <= b.first || b.second <= a.first;
      };
      for (std::size_t a : group_[i]) {
        ok = ok && memory_.offset[a] >= 0;
        for (std::size_t b : group_[i])
          if (a < b) ok = ok && apart(bytes_of(a), bytes_of(b));
        if (a != i)
          for (ir::ValueId operand : n.inputs) ok = ok && apart(bytes_of(a), bytes_of(static_cast<std::size_t>(operand)));
      }
      group_fused_[i] = ok;
    }
  }

  bool computed_with_leader(std::size_t i) const { return leader_[i] >= 0 && group_fused_[static_cast<std::size_t>(leader_[i])]; }

  void execute(std::size_t i) {
    const Node& n = graph_.nodes()[i];
    auto in = [&](int k) {
      auto v = static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(k)]);
      return cpu::ConstView{value_ptr(v), shapes_[v]};
    };
    // The attention ops' scores: q, k, the keep-mask operand at `mask_at` (none when < 0) held
    // in `mask`, the bound scale and the causal attributes.
    auto scores = [&](const Node& node, int mask_at, cpu::ConstView& mask) {
      if (mask_at >= 0) mask = in(mask_at);
      cpu::ScoreArgs s{in(0),
                       in(1),
                       mask_at >= 0 ? &mask : nullptr,
                       static_cast<float>(ir::bound_value(graph_, node, shapes_)),
                       node.attrs.causal,
                       node.attrs.align,
                       node.attrs.window};
      s.tiles = &tiles_;
      return s;
    };
    // Flex attention's modifier over its tensors (operands `first` on), iterated like the
    // kernel's scores: over the output's batch dims.
    auto modifier = [&](const Node& node, std::size_t first, bool derivative) {
      std::vector<cpu::ConstView> tensors;
      for (std::size_t k = 0; k < ir::modifier_tensor_count(node.op, node.attrs, node.inputs.size()); ++k)
        tensors.push_back(in(static_cast<int>(first + k)));
      ir::Shape batch;
      for (int r = 0; r + 2 < shapes_[i].rank; ++r) batch.push_back(shapes_[i][r]);
      return cpu::ScoreModifier(*node.region, derivative, std::move(tensors), batch, in(0).shape.back(1), in(1).shape.back(1));
    };
    // Flex attention's dropout: its probability, and the seed (the last operand).
    auto dropout = [&](const Node& node, cpu::ScoreArgs& s) {
      if (!ir::has_dropout_seed(node.op, node.attrs)) return;
      s.dropout = node.attrs.dropout;
      s.seed = dropout_seed(in(static_cast<int>(node.inputs.size() - 1)).data[0]);
    };
    cpu::View out{nullptr, shapes_[i]};
    if (memory_.offset[i] >= 0) out.data = out_ptr(i);
    // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
    // clang-format off
    switch (n.op) {
      case Op::input:
        if (out.data) {
          const Tensor& t = input_tensor(i);
          for (std::int64_t j = 0; j < t.numel(); ++j) out.data[j] = static_cast<float>(t.at(j));
        }
        return;
      case Op::constant: return cpu::fill(out, static_cast<float>(ir::bound_value(graph_, n, shapes_)));
      QKV_UNARY_CASES
      case Op::cast: return cpu::unary(n.op, in(0), out);
      QKV_BINARY_CASES
      QKV_COMPARE_CASES return cpu::binary(n.op, in(0), in(1), out);
      case Op::broadcast_to: return cpu::broadcast(in(0), out);
      case Op::one_hot: return cpu::one_hot(in(0), n.attrs.depth, out);
      case Op::log_softmax: return cpu::log_softmax(in(0), n.attrs.axis, out);
      case Op::reduce_mean: break;  // decomposed
      case Op::where: return cpu::select(in(0), in(1), in(2), out);
      QKV_REDUCE_CASES return cpu::reduce(n.op, in(0), n.attrs.axis, out);
      case Op::matmul: return cpu::matmul(in(0), in(1), n.attrs.transpose_a, n.attrs.transpose_b, out);
      case Op::permute: return cpu::permute(in(0), n.attrs.perm, out);
      case Op::reshape: return;  // aliases its operand's storage
      case Op::causal_mask: return cpu::causal_mask(n.attrs.align, n.attrs.window, out);
      case Op::slice: return cpu::slice(in(0), n.attrs.axis, n.attrs.begin, out);
      case Op::concat: return cpu::concat(in(0), in(1), n.attrs.axis, out);
      case Op::iota: return cpu::iota(n.attrs.axis, out);
      case Op::dropout_mask: return cpu::dropout_mask(in(1), n.attrs.value, out);
      case Op::softmax: return cpu::softmax(in(0), n.attrs.axis, out);
      case Op::attention:
      case Op::masked_attention: {
        cpu::ConstView mask{};
        float* lse = group_fused_[i] ? out_ptr(group_[i][1]) : nullptr;  // with its attention_lse
        return cpu::attention({scores(n, n.op == Op::masked_attention ? 3 : -1, mask), in(2), out, lse});
      }
      case Op::attention_lse:
      case Op::masked_attention_lse: {
        cpu::ConstView mask{};
        return cpu::attention_lse(scores(n, n.op == Op::masked_attention_lse ? 2 : -1, mask), out);
      }
      case Op::attention_grad:
      case Op::masked_attention_grad: {
        cpu::ConstView mask{};
        const cpu::AttentionGradArgs args{scores(n, n.op == Op::masked_attention_grad ? 6 : -1, mask), in(2), in(3), in(4), in(5),
                                          n.attrs.wrt, out};
        if (!group_fused_[i]) return cpu::attention_grad(args);
        float* grads[3] = {nullptr, nullptr, nullptr};
        for (std::size_t member : group_[i]) grads[graph_.nodes()[member].attrs.wrt] = out_ptr(member);
        return cpu::attention_grads(args, grads[0], grads[1], grads[2]);
      }
      case Op::flex_attention: {
        cpu::ConstView none{};
        const cpu::ScoreModifier mod = modifier(n, 3, false);
        cpu::ScoreArgs s = scores(n, -1, none);
        s.mod = &mod;
        dropout(n, s);
        float* lse = group_fused_[i] ? out_ptr(group_[i][1]) : nullptr;  // with its flex_attention_lse
        return cpu::attention({s, in(2), out, lse});
      }
      case Op::flex_attention_lse: {
        cpu::ConstView none{};
        const cpu::ScoreModifier mod = modifier(n, 2, false);
        cpu::ScoreArgs s = scores(n, -1, none);
        s.mod = &mod;
        return cpu::attention_lse(s, out);
      }
      case Op::flex_attention_grad: {  // q, k and v (cpu_supports): a modifier tensor's is decomposed
        cpu::ConstView none{};
        const cpu::ScoreModifier mod = modifier(n, 6, true);
        cpu::ScoreArgs s = scores(n, -1, none);
        s.mod = &mod;
        dropout(n, s);
        const cpu::AttentionGradArgs args{s, in(2), in(3), in(4), in(5), n.attrs.wrt, out};
        if (!group_fused_[i]) return cpu::attention_grad(args);
        float* grads[3] = {nullptr, nullptr, nullptr};
        for (std::size_t member : group_[i]) grads[graph_.nodes()[member].attrs.wrt] = out_ptr(member);
        return cpu::attention_grads(args, grads[0], grads[1], grads[2]);
      }
    }
    // clang-format on
    QKV_UNREACHABLE("op");
  }

  cpu::TileCounter tiles_;                       // the running kernel's tiles
  std::vector<TileCount> tile_counts_;           // the last run's, per fused kernel
  std::vector<ir::ValueId> leader_;              // node -> its kernel group's leader, or -1
  std::vector<std::vector<std::size_t>> group_;  // leader -> its group's nodes (empty otherwise)
  std::vector<bool> group_fused_;                // leader -> the group runs as one kernel
  std::vector<int> slot_;                        // node -> index into tensors_ (inputs only)
  ir::MemoryPlan memory_;
  std::vector<float> arena_;
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::string device() const override {
    return "host CPU, qkv's vector kernels " + std::string(cpu::isa_name(cpu::host_isa())) + ", " + std::string(openblas_get_config()) + ", " +
           std::to_string(cpu::ThreadPool::global().size()) + " threads (OpenBLAS on 1, qkv's pool owns the cores)";
  }
  bool supports(const Node& n) const override { return cpu_supports(n); }
  std::string kernel_name(const ir::Graph& g, ir::ValueId v) const override {
    // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
    // clang-format off
    switch (g.node(v).op) {
      case Op::input: return g.node(v).dtype == DType::f32 ? "(input, read in place)" : "(input, widened to f32)";
      case Op::reshape: return "(view of its operand)";
      case Op::matmul: return "sgemm";
      case Op::attention:
      case Op::masked_attention: return "fused attention (online softmax)";
      // The modifier is named: explain says what was fused.
      case Op::flex_attention: {
        const Node& n = g.node(v);
        return "fused flex attention (online softmax), mod = " + ir::region_expression(*n.region) +
               (n.attrs.dropout != 0.0 ? ", dropout " + ir::format_number(n.attrs.dropout) : "");
      }
      QKV_ATTENTION_BACKWARD_CASES {
        // A group's other nodes are computed by its leader's kernel (see kernel_groups).
        const auto groups = kernel_groups(g);
        const Op op = g.node(v).op;
        const bool lse = op == Op::attention_lse || op == Op::masked_attention_lse || op == Op::flex_attention_lse;
        for (std::size_t i = 0; i < groups.size(); ++i)
          for (std::size_t j = 1; j < groups[i].size(); ++j)
            if (groups[i][j] == static_cast<std::size_t>(v))
              return "(in %" + std::to_string(i) + "'s kernel" + (lse ? ")" : " with a batch entry per thread)");
        return lse ? "fused attention row log-sum-exp" : "fused attention backward (FlashAttention-2)";
      }
      case Op::softmax:
      case Op::log_softmax: return "row softmax";
      case Op::constant:
      QKV_UNARY_CASES
      QKV_CAST_CASES
      QKV_BINARY_CASES
      QKV_SELECT_CASES
      QKV_COMPARE_CASES
      QKV_REDUCE_CASES
      QKV_MASK_CASES
      case Op::permute:
      case Op::broadcast_to:
      case Op::slice:
      case Op::concat:
      case Op::reduce_mean: return "loop";
    }
    // clang-format on
    QKV_UNREACHABLE("an op without a kernel name");
  }
  std::unique_ptr<Executable> compile(const ir::Graph& g) override {
    cpu::ThreadPool::global();  // pins OpenBLAS to one thread before any sgemm runs
    return half_precision_boundary(
        g, std::make_unique<CpuExecutable>(ir::lower_for_backend(g, [this](const Node& n) { return supports(n); })),
        [](std::int64_t n, const std::function<void(std::int64_t)>& fn) { cpu::ThreadPool::global().parallel_for(n, fn); });
  }
};

}  // namespace

bool cpu_supports(const Node& n) {
  // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
  // clang-format off
  switch (n.op) {
    case Op::softmax:
    case Op::log_softmax: return true;
    case Op::reduce_mean: return false;
    // The gradient of a modifier tensor (wrt >= 3) is score-shaped before its sum: decomposed.
    case Op::flex_attention_grad: return n.attrs.wrt <= 2;
    QKV_PRIMITIVE_CASES
    case Op::attention:
    case Op::masked_attention:
    case Op::attention_lse:
    case Op::masked_attention_lse:
    case Op::attention_grad:
    case Op::masked_attention_grad:
    case Op::flex_attention:
    case Op::flex_attention_lse: return true;
  }
  // clang-format on
  return false;
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace qkv::backend
