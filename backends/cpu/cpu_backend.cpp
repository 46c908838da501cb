// The CPU backend's executable: a memory plan per input shapes, then one kernel call per node.
#include "backends/cpu/cpu_backend.hpp"

#include <cblas.h>

#include <cstring>
#include <memory>
#include <optional>

#include "backends/cpu/attention.hpp"
#include "backends/cpu/gemm.hpp"
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
#include "ir/storage_plan.hpp"

namespace qkv::backend {

namespace {

using ir::Node;
using ir::Op;

/// Nodes one kernel computes together: attention and the attention_lse of its operands (placed
/// next to it by the pipeline), attention and its tangent (forward mode, placed next to it too;
/// the tangent's kernel computes both; with an lse as well, the tangent comes first and the lse
/// has a pass of its own), and
/// attention's gradients with respect to q, k and v (three nodes with the same operands, emitted
/// together by autodiff). Indexed by the node whose kernel runs them (its leader): the group's
/// nodes, the leader first; empty for the others.
std::vector<std::vector<std::size_t>> kernel_groups(const ir::Graph& g) {
  std::vector<std::vector<std::size_t>> group(g.size());
  std::vector<bool> member(g.size(), false);
  for (std::size_t i = 0; i + 1 < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!ir::attention_roles(n.op).forward()) continue;
    const Node& s = g.nodes()[i + 1];
    if (ir::is_tangent_of(s, n)) {
      group[i + 1] = {i + 1, i};
      member[i] = true;
      continue;
    }
    const ir::LseCall lse = ir::lse_of(n);
    if (s.op != lse.op || s.inputs != lse.inputs || !(s.attrs == lse.attrs) || !ir::same_region(s.region.get(), n.region.get())) continue;
    group[i] = {i, i + 1};
    member[i + 1] = true;
  }
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!ir::attention_roles(n.op).backward() || n.attrs.wrt > 2 || member[i]) continue;
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

/// The storage plan of the cpu kernels. Values are held in f32 but for a half graph's 16-bit
/// ones (its kept half inputs, each round_f16 or round_bf16 result and the casts to a half type);
/// bool and i32 inputs are widened into the arena. A reshape is a view of its operand, so is the
/// cast to f32 of 16-bit values (a half view: its readers widen what they read, or read it as it
/// is: reads_half) and the cast of a value already held in the cast's dtype (an exact round). The
/// round or 16-bit cast that is the only reader of a fused attention, of its tangent, or of its
/// gradient with respect to q, k or v, is written by that kernel, rounded as it stores (narrowed;
/// a forward computed in its tangent's kernel, by that one). A cache update
/// is planned as a kernel: the executable writes it into the cache in place when it holds the
/// cache as state (known when state is set, not from the graph).
ir::StoragePlan cpu_storage_plan(const ir::Graph& g) {
  ir::StoragePlan plan;
  plan.values.resize(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    ir::ValueStorage& s = plan.values[i];
    if (n.op == Op::input) s.kind = ir::StorageKind::input;
    if ((n.op == Op::input || n.op == Op::cast) && is_half(n.dtype)) s.held = n.dtype;
    if (n.op == Op::round_f16) s.held = DType::f16;
    if (n.op == Op::round_bf16) s.held = DType::bf16;
    if (n.op == Op::reshape) s.kind = ir::StorageKind::reshape;
    else if (n.op == Op::cast && n.dtype == DType::f32 && is_half(g.node(n.inputs[0]).dtype)) s.kind = ir::StorageKind::half_view;
    else if (n.op == Op::cast && is_half(n.dtype) && plan.held(n.inputs[0]) == n.dtype) s.kind = ir::StorageKind::exact_round;
    if (s.is_view()) {
      s.of = n.inputs[0];
      s.held = plan.held(s.of);
    }
    // Keys and values from a paged cache: the attention kernels read the pages where they are.
    if (n.op == Op::page_gather && ir::read_as_keys_or_values(g, static_cast<ir::ValueId>(i))) s.kind = ir::StorageKind::paged;
  }
  std::vector<int> readers(g.size(), 0);
  std::vector<ir::ValueId> reader(g.size(), -1);
  for (std::size_t i = 0; i < g.size(); ++i)
    for (ir::ValueId v : g.nodes()[i].inputs) {
      ++readers[static_cast<std::size_t>(v)];
      reader[static_cast<std::size_t>(v)] = static_cast<ir::ValueId>(i);
    }
  for (ir::ValueId v : g.result_values()) readers[static_cast<std::size_t>(v)] += 2;  // kept whole
  for (std::size_t i = 0; i < g.size(); ++i) {
    const ir::AttentionRoles& roles = ir::attention_roles(g.nodes()[i].op);
    const bool grad = roles.backward() && g.nodes()[i].attrs.wrt <= 2;
    if ((!roles.forward() && !grad && !roles.jvp()) || readers[i] != 1) continue;
    const ir::ValueId r = reader[i];
    const Node& round = g.node(r);
    if (round.op != Op::round_f16 && round.op != Op::round_bf16 && !(round.op == Op::cast && is_half(round.dtype))) continue;
    ir::ValueStorage& rs = plan.values[static_cast<std::size_t>(r)];
    rs.kind = ir::StorageKind::narrowed;
    rs.of = static_cast<ir::ValueId>(i);
    plan.values[i].into = {r, 0};
    plan.values[i].held = rs.held;
  }
  for (ir::ValueStorage& s : plan.values) {  // what 16-bit storage holds is 16-bit numbers
    s.f16_numbers = s.held == DType::f16;
    s.bf16_numbers = s.held == DType::bf16;
  }
  ir::verify_storage(g, plan);
  return plan;
}

/// Whether operand `k` of `n` may be f16 or bf16 for its kernel: fused attention's forward and
/// log-sum-exp read q, k and v so, its gradients q, k, v and dy (widening each tile as they load
/// it), matmul its right operand and embedding its table; the other kernels get their half
/// operands widened.
bool reads_half(const Node& n, std::size_t k) {
  if (ir::attention_roles(n.op).attention()) return ir::attention_roles(n.op).streamed(k);
  // matmul its right operand (weights held in 16 bits), converted as it is streamed; embedding
  // its table, a row at a time.
  return (n.op == Op::matmul || n.op == Op::embedding) && k == 1;
}

class CpuExecutable final : public ExecutableSkeleton {
 public:
  explicit CpuExecutable(ir::Graph g) : ExecutableSkeleton(std::move(g)), slot_(graph_.size(), -1), storage_(cpu_storage_plan(graph_)) {
    for (std::size_t i = 0; i < input_ids_.size(); ++i) slot_[static_cast<std::size_t>(input_ids_[i])] = static_cast<int>(i);
    find_kernel_groups();
  }
  std::int64_t planned_bytes() const override { return memory_.total_bytes + scratch_bytes_; }
  std::vector<TileCount> tile_counts() const override { return tile_counts_; }

  void set_state(TensorMap tensors) override {
    check_state_names(graph_, tensors);
    state_ = std::move(tensors);  // read in place by the next runs; their shapes are part of the plan's signature
  }
  TensorMap state() override { return state_; }

  void compute() override {
    tile_counts_.clear();
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      if (!computed_with_leader(i) && !in_kernel_of_operand(i)) {
        tiles_.computed = 0;
        tiles_.skipped = 0;
        tiles_.unmasked = 0;
        execute(i);
        if (ir::is_fused_attention(graph_.nodes()[i].op))
          tile_counts_.push_back({static_cast<ir::ValueId>(i), tiles_.computed.load(), tiles_.skipped.load(), tiles_.unmasked.load()});
        // Members before their leader (the forward in its tangent's kernel) are final only now.
        if (group_fused_[i])
          for (std::size_t m : group_[i])
            if (m < i) computed(static_cast<ir::ValueId>(m));
      }
      // A group's later members were computed by their leader's kernel; earlier ones wait for it.
      if (!computed_with_leader(i) || static_cast<std::size_t>(leader_[i]) < i) computed(static_cast<ir::ValueId>(i));
    }
    // Updates write back into the held tensors once every kernel has read the old values.
    for (const auto& [name, v] : graph_.updates()) {
      Tensor& held = state_.at(name);
      const ConstBytes src = value_bytes(static_cast<std::size_t>(v));
      if (src.data == held.raw() || !held.nbytes()) continue;
      if (src.stored == held.dtype()) std::memcpy(held.raw(), src.data, held.nbytes());
      else convert_into(src, held);
    }
  }
  Tensor output(std::string_view, ir::ValueId v) override {
    const ConstBytes src = value_bytes(static_cast<std::size_t>(v));
    return held_output(v, src.data, src.stored);
  }
  void output_into(std::string_view, ir::ValueId v, Tensor& dst) override {
    const ConstBytes src = value_bytes(static_cast<std::size_t>(v));
    held_output_into(v, src.data, src.stored, dst);
  }

 private:
  /// An operand widened to f32 before its kernel runs, at a byte offset in the scratch.
  using Widened = std::pair<ir::ValueId, std::int64_t>;
  /// A value's bytes and the dtype they hold.
  struct ConstBytes {
    const void* data;
    DType stored;
  };

  void plan() override {
    bind_shapes();
    modifiers_.clear();  // built again for these shapes at their first run
    modifiers_.resize(graph_.size());
    bytes_.assign(graph_.size(), 0);
    for (std::size_t i = 0; i < graph_.size(); ++i)
      bytes_[i] = storage_.values[i].kind == ir::StorageKind::paged ? 0 : shapes_[i].numel() * static_cast<std::int64_t>(dtype_size(held(i)));
    paged_rows_.assign(graph_.size(), {});
    std::vector<std::int64_t> views = storage_.memory_views();
    const std::vector<ir::Placement> placed = storage_.memory_placements();  // attentions writing their rounded outputs
    in_place_.assign(graph_.size(), false);
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      // A cache the executable holds takes its new rows where it is (the update then copies nothing).
      if (ir::writes_into_operand(graph_, static_cast<ir::ValueId>(i)) && held(i) == DType::f32 &&
          state_.contains(graph_.node(graph_.nodes()[i].inputs[0]).name)) {
        views[i] = 0;
        in_place_[i] = true;
      }
    }
    // A kernel reading a paged page_gather reads its pages and block table when it runs: they live
    // until then (not only until the gather, which has no kernel).
    std::vector<std::vector<ir::ValueId>> reads(graph_.size());
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      reads[i] = graph_.nodes()[i].inputs;
      for (ir::ValueId in : graph_.nodes()[i].inputs)
        if (const ir::ValueId gather = paged_source(in); gather >= 0)
          reads[i].insert(reads[i].end(), graph_.node(gather).inputs.begin(), graph_.node(gather).inputs.end());
    }
    // f32, f16 and bf16 inputs are read where the caller keeps them; bool and i32 inputs are
    // widened into the arena.
    memory_ = ir::plan_memory(
        graph_, bytes_, [](const Node& n) { return n.op == Op::input && (n.dtype == DType::f32 || is_half(n.dtype)); }, 64, &reads, &views, &placed);
    plan_kernel_groups();
    plan_widening();
    const std::int64_t total = memory_.total_bytes + scratch_bytes_;
    try {
      arena_.assign(static_cast<std::size_t>(total / 4 + 16), 0.0f);
    } catch (const std::bad_alloc&) {
      std::size_t largest = 0;
      for (std::size_t i = 1; i < bytes_.size(); ++i)
        if (bytes_[i] > bytes_[largest]) largest = i;
      throw ResourceError("cpu: out of memory: the plan for these shapes needs " + std::to_string(total) + " bytes; the largest value is %" +
                          std::to_string(largest) + " " + std::string(ir::op_name(graph_.nodes()[largest].op)) + " " +
                          graph_.type_string(graph_.nodes()[largest].dtype, shapes_[largest]) + " (" + std::to_string(bytes_[largest]) + " bytes)");
    }
  }

  /// Whether node i is an elementwise op (not a cast) over operands of its own shape or single
  /// values (a scale), some of them f16 or bf16, or a sum or max over an axis of an f16 or bf16 operand, computing an f32
  /// value: it runs in chunks over the pool, each widening its part of the half operands into
  /// its thread's buffers (never an operand whole; a reduction's chunks are whole rows of the
  /// dims before its axis).
  bool chunkwise(std::size_t i) const {
    const Node& n = graph_.nodes()[i];
    const ir::OpCategory c = ir::op_info(n.op).category;
    const bool elementwise = c == ir::OpCategory::unary || c == ir::OpCategory::binary || c == ir::OpCategory::compare || c == ir::OpCategory::select;
    const bool reduction = n.op == Op::reduce_sum || n.op == Op::reduce_max;
    if ((!elementwise && !reduction) || n.op == Op::cast || held(i) != DType::f32 || memory_.offset[i] < 0) return false;
    if (reduction) return is_half(storage_.held(n.inputs[0]));
    bool half = false;
    for (ir::ValueId v : n.inputs) {
      const auto u = static_cast<std::size_t>(v);
      if (!(shapes_[u] == shapes_[i]) && shapes_[u].numel() != 1) return false;
      half |= is_half(held(u)) && shapes_[u] == shapes_[i];
    }
    return half;
  }

  /// Runs chunkwise node i (see chunkwise) into `out`.
  void execute_chunkwise(std::size_t i, float* out) {
    const Node& n = graph_.nodes()[i];
    if (n.op == Op::reduce_sum || n.op == Op::reduce_max) {
      const ir::Shape& xs = shapes_[static_cast<std::size_t>(n.inputs[0])];
      std::int64_t outer = 1, inner = 1;  // the dims before the axis, and after it
      for (int d = 0; d < n.attrs.axis; ++d) outer *= xs[d];
      for (int d = n.attrs.axis + 1; d < xs.rank; ++d) inner *= xs[d];
      const std::int64_t along = xs[n.attrs.axis], row = along * inner;
      const ConstBytes b = value_bytes(static_cast<std::size_t>(n.inputs[0]));
      const std::int64_t rows_per_chunk = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(row, 1));
      cpu::ThreadPool::global().parallel_for((outer + rows_per_chunk - 1) / rows_per_chunk, [&](std::int64_t c) {
        thread_local std::vector<float> buffer;
        const std::int64_t o0 = c * rows_per_chunk, rows = std::min(rows_per_chunk, outer - o0);
        if (buffer.size() < static_cast<std::size_t>(rows * row)) buffer.resize(static_cast<std::size_t>(rows * row));
        cpu::widen({nullptr, ir::Shape{}, b.data, b.stored}, o0 * row, rows * row, buffer.data());
        cpu::reduce(n.op, {buffer.data(), ir::Shape{rows, along, inner}}, 1, {out + o0 * inner, ir::Shape{rows, 1, inner}});
      });
      return;
    }
    chunked(shapes_[i].numel(), [&](std::int64_t first, std::int64_t count) {
      thread_local std::vector<float> buffers[3];
      cpu::ConstView x[3] = {{nullptr, {}}, {nullptr, {}}, {nullptr, {}}};
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        const auto u = static_cast<std::size_t>(n.inputs[k]);
        const ConstBytes b = value_bytes(u);
        const bool single = !(shapes_[u] == shapes_[i]);  // one value, broadcast over the chunk
        const std::int64_t at = single ? 0 : first, length = single ? 1 : count;
        x[k] = {static_cast<const float*>(b.data) + at, single ? ir::Shape{} : ir::Shape{count}};
        if (b.stored == DType::f32) continue;
        if (buffers[k].size() < static_cast<std::size_t>(length)) buffers[k].resize(static_cast<std::size_t>(length));
        cpu::widen({nullptr, ir::Shape{}, b.data, b.stored}, at, length, buffers[k].data());
        x[k].data = buffers[k].data();
      }
      const cpu::View part{out + first, ir::Shape{count}};
      switch (ir::op_info(n.op).category) {
        case ir::OpCategory::unary: return cpu::unary(n.op, x[0], part);
        case ir::OpCategory::select: return cpu::select(x[0], x[1], x[2], part);
        case ir::OpCategory::binary:
        case ir::OpCategory::compare: return cpu::binary(n.op, x[0], x[1], part);
        case ir::OpCategory::source:
        case ir::OpCategory::reduce:
        case ir::OpCategory::contract:
        case ir::OpCategory::layout:
        case ir::OpCategory::mask:
        case ir::OpCategory::composite: break;  // not elementwise: chunkwise() refuses them
      }
      QKV_UNREACHABLE("a chunkwise node is elementwise");
    });
  }

  /// Where each kernel's f16 and bf16 operands that it cannot read as they are are widened to
  /// f32 before it runs: per node, (operand, byte offset in the scratch after the arena); the
  /// scratch is as large as the largest node's widened operands together.
  void plan_widening() {
    widened_.assign(graph_.size(), {});
    scratch_bytes_ = 0;
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      const Node& n = graph_.nodes()[i];
      if (n.op == Op::input || storage_.values[i].is_view() || storage_.values[i].kind == ir::StorageKind::paged || computed_with_leader(i) ||
          in_kernel_of_operand(i) || chunkwise(i))
        continue;
      std::int64_t at = 0;
      for (std::size_t k = 0; k < n.inputs.size(); ++k) {
        const auto v = static_cast<std::size_t>(n.inputs[k]);
        const bool seen = std::any_of(widened_[i].begin(), widened_[i].end(), [&](const auto& w) { return w.first == n.inputs[k]; });
        if (held(v) == DType::f32 || reads_half(n, k) || seen) continue;
        widened_[i].emplace_back(n.inputs[k], at);
        at += (shapes_[v].numel() * 4 + 63) / 64 * 64;
      }
      scratch_bytes_ = std::max(scratch_bytes_, at);
    }
  }

  /// The dtype value i's storage holds.
  DType held(std::size_t i) const { return storage_.values[i].held; }
  /// Whether value i is computed by its operand's kernel (a round an attention writes).
  bool in_kernel_of_operand(std::size_t i) const { return storage_.values[i].kind == ir::StorageKind::narrowed; }
  const Tensor& input_tensor(std::size_t v) const { return *tensors_[static_cast<std::size_t>(slot_[v])]; }
  std::byte* arena_bytes() { return reinterpret_cast<std::byte*>(arena_.data()); }
  const std::byte* arena_bytes() const { return reinterpret_cast<const std::byte*>(arena_.data()); }
  /// Value v's bytes: in the arena, or in the caller's tensor for an input read in place.
  ConstBytes value_bytes(std::size_t v) const {
    auto root = static_cast<std::size_t>(memory_.storage_of[v]);
    if (memory_.offset[root] < 0) return {input_tensor(root).raw(), held(v)};
    return {arena_bytes() + memory_.offset[root], held(v)};
  }
  float* out_ptr(std::size_t v) { return reinterpret_cast<float*>(arena_bytes() + memory_.offset[v]); }

  /// `src` converted into `to` (of the same element count, another float dtype).
  void convert_into(const ConstBytes& src, Tensor& to) const {
    const std::int64_t n = to.numel();
    std::vector<float> f32;
    const float* from = static_cast<const float*>(src.data);
    if (src.stored != DType::f32) {
      f32.resize(static_cast<std::size_t>(n));
      cpu::widen({nullptr, ir::Shape{}, src.data, src.stored}, 0, n, f32.data());
      from = f32.data();
    }
    if (to.dtype() == DType::f32) std::copy_n(from, n, to.data<float>());
    else cpu::narrow(from, n, {nullptr, ir::Shape{}, to.raw(), to.dtype()}, 0);
  }

  /// The `n` values at `src` widened into `to`, in chunks over the thread pool.
  static void widen_into(const ConstBytes& src, std::int64_t n, float* to) {
    const cpu::ConstView x{static_cast<const float*>(src.data), ir::Shape{}, src.data, src.stored};
    chunked(n, [&](std::int64_t first, std::int64_t count) { cpu::widen(x, first, count, to + first); });
  }
  /// x rounded into out's 16-bit storage (round_f16, round_bf16), in chunks over the thread pool.
  static void narrow_into(const cpu::ConstView& x, const cpu::View& out) {
    chunked(out.shape.numel(), [&](std::int64_t first, std::int64_t count) { cpu::narrow(x.data + first, count, out, first); });
  }
  /// f(first, count) over [0, n) in chunks of 64K elements (large enough to stream), on the pool.
  template <class F> static void chunked(std::int64_t n, F f) {
    constexpr std::int64_t kChunk = std::int64_t{1} << 16;
    if (n <= kChunk) return f(std::int64_t{0}, n);
    cpu::ThreadPool::global().parallel_for((n + kChunk - 1) / kChunk, [&](std::int64_t c) { f(c * kChunk, std::min(kChunk, n - c * kChunk)); });
  }

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
        const ir::Shape& dy = shapes_[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(ir::attention_roles(n.op).dy)])];
        std::int64_t batches = 1;
        for (int d = 0; d + 2 < dy.rank; ++d) batches *= dy[d];
        ok = batches >= static_cast<std::int64_t>(cpu::ThreadPool::global().size());
      }
      // Byte ranges in the arena (empty for values read where the caller keeps them).
      auto bytes_of = [&](std::size_t v) {
        const auto root = static_cast<std::size_t>(memory_.storage_of[v]);
        const std::int64_t at = memory_.offset[root];
        return std::pair<std::int64_t, std::int64_t>{at, at < 0 ? at : at + bytes_[root]};
      };
      auto apart = [](std::pair<std::int64_t, std::int64_t> a, std::pair<std::int64_t, std::int64_t> b) {
        return a.first < 0 || b.first < 0 || a.second <= b.first || b.second <= a.first;
      };
      for (std::size_t a : group_[i]) {
        ok = ok && memory_.offset[static_cast<std::size_t>(memory_.storage_of[a])] >= 0;
        for (std::size_t b : group_[i])
          if (a < b) ok = ok && apart(bytes_of(a), bytes_of(b));
        if (a != i)
          for (ir::ValueId operand : n.inputs) ok = ok && apart(bytes_of(a), bytes_of(static_cast<std::size_t>(operand)));
      }
      group_fused_[i] = ok;
    }
  }

  /// Group i's joint gradient kernel (dq, dk and dv of one attention): each member's output
  /// where it lives, rounded into its round's 16-bit storage where its kernel rounds it.
  void attention_grads(std::size_t i, const cpu::AttentionGradArgs& args) {
    std::optional<cpu::View> grads[3];
    for (std::size_t member : group_[i]) grads[graph_.nodes()[member].attrs.wrt] = written_view(member);
    auto at = [&](int k) { return grads[k] ? &*grads[k] : nullptr; };
    cpu::attention_grads(args, at(0), at(1), at(2));
  }

  /// Where a group member's kernel writes value v: its own storage, or its round's 16-bit
  /// storage where the kernel rounds it as it stores (StorageKind::narrowed).
  cpu::View written_view(std::size_t v) {
    const ir::ValueId r = storage_.values[v].into.into;
    return r >= 0 ? cpu::View{nullptr, shapes_[v], arena_bytes() + memory_.offset[static_cast<std::size_t>(r)], storage_.held(r)}
                  : cpu::View{out_ptr(v), shapes_[v]};
  }

  /// The paged page_gather (StorageKind::paged) that value v is, or is a reshape of; -1 otherwise.
  ir::ValueId paged_source(ir::ValueId v) const {
    while (graph_.node(v).op == Op::reshape) v = graph_.node(v).inputs[0];
    return storage_[v].kind == ir::StorageKind::paged ? v : -1;
  }

  /// Paged page_gather `gather` as its reader sees it (in `shape`): its pages where they are held,
  /// found through its block table.
  cpu::ConstView paged_operand(ir::ValueId gather, const ir::Shape& shape) {
    const Node& g = graph_.node(gather);
    const auto pool = static_cast<std::size_t>(g.inputs[0]), table = static_cast<std::size_t>(g.inputs[1]);
    const ConstBytes p = value_bytes(pool), t = value_bytes(table);
    const cpu::ConstView pages = p.stored == DType::f32 ? cpu::ConstView{static_cast<const float*>(p.data), shapes_[pool]}
                                                        : cpu::ConstView{nullptr, shapes_[pool], p.data, p.stored};
    return cpu::paged_view(pages, {static_cast<const float*>(t.data), shapes_[table]}, shape, paged_rows_[static_cast<std::size_t>(gather)]);
  }

  bool computed_with_leader(std::size_t i) const { return leader_[i] >= 0 && group_fused_[static_cast<std::size_t>(leader_[i])]; }

  /// A fused attention op (execute's): its scores from q, k, the keep-mask, the bound scale and
  /// the causal attributes (operands found by their roles), with flex attention's modifier over
  /// its tensors (the operands after the fixed ones, iterated over the output's batch dims) and
  /// dropout; then the forward (with its log-sum-exp beside it when grouped), the row statistic,
  /// or the gradients. `in(k)` is operand k as the kernel reads it.
  template <class In> void execute_attention(std::size_t i, const Node& n, const In& in, const cpu::View& out) {
    const ir::AttentionRoles& roles = ir::attention_roles(n.op);
    cpu::ConstView mask{};
    if (roles.mask >= 0) mask = in(roles.mask);
    const auto scale = static_cast<float>(ir::bound_scale(graph_, n, shapes_));
    cpu::ScoreArgs s{in(roles.q), in(roles.k), roles.mask >= 0 ? &mask : nullptr, scale, n.attrs.causal, n.attrs.align, n.attrs.window};
    s.tiles = &tiles_;
    if (ir::is_flex_attention(n.op)) {  // a modifier tensor's gradient is decomposed (cpu_supports)
      // Built at the first run of a plan, its tensors pointed at each later run's values.
      std::unique_ptr<cpu::ScoreModifier>& mod = modifiers_[i];
      const std::size_t count = ir::modifier_tensor_count(n.op, n.attrs, n.inputs.size());
      auto tensor = [&](std::size_t k) { return in(static_cast<int>(ir::fixed_operands(n.op) + k)); };
      if (!mod) {
        std::vector<cpu::ConstView> tensors;
        for (std::size_t k = 0; k < count; ++k) tensors.push_back(tensor(k));
        ir::Shape batch;
        for (int r = 0; r + 2 < shapes_[i].rank; ++r) batch.push_back(shapes_[i][r]);
        mod = std::make_unique<cpu::ScoreModifier>(*n.region, roles.backward() || roles.jvp(), std::move(tensors), batch, s.q.shape.back(1),
                                                   s.k.shape.back(1));
      } else {
        for (std::size_t k = 0; k < count; ++k) mod->set_tensor_data(k, tensor(k).data);
      }
      s.mod = mod.get();
    }
    cpu::ConstView sink{};
    if (ir::has_sink(n.op, n.attrs)) {
      sink = in(static_cast<int>(ir::sink_operand(n.op, n.attrs, n.inputs.size())));
      s.sink = &sink;
    }
    if (ir::has_dropout_seed(n.op, n.attrs)) {  // its probability, and the seed (the last operand)
      s.dropout = n.attrs.dropout;
      s.seed = dropout_seed(in(static_cast<int>(n.inputs.size() - 1)).data[0]);
    }
    if (roles.forward()) return cpu::attention({s, in(roles.v), out, group_fused_[i] ? out_ptr(group_[i][1]) : nullptr});
    if (roles.jvp()) {  // with the forward's output when they are one kernel, else only the tangent
      const cpu::View y = group_fused_[i] ? written_view(group_[i][1]) : cpu::View{nullptr, out.shape};
      // A tangent that is a constant zero (an input without one: build_jvp's zeros, rounded or
      // cast to a half dtype in a half graph) is passed without data: the kernel leaves its
      // products out.
      auto tangent = [&](int k) {
        const int at = roles.tangent + k;
        const ir::ValueId v = n.inputs[static_cast<std::size_t>(at)];
        ir::ValueId x = v;
        while (graph_.node(x).op == Op::cast || graph_.node(x).op == Op::round_f16 || graph_.node(x).op == Op::round_bf16)
          x = graph_.node(x).inputs[0];
        const bool zero = graph_.node(x).op == Op::constant && graph_.node(x).attrs.value == 0.0;
        return zero ? cpu::ConstView{nullptr, shapes_[static_cast<std::size_t>(v)]} : in(at);
      };
      return cpu::attention_jvp({{s, in(roles.v), y}, tangent(0), tangent(1), tangent(2), out});
    }
    if (!roles.backward()) return cpu::attention_lse(s, out);
    const cpu::AttentionGradArgs args{s, in(roles.v), in(roles.dy), in(roles.lse), in(roles.delta), n.attrs.wrt, out};
    if (!group_fused_[i]) return cpu::attention_grad(args);
    attention_grads(i, args);
  }

  void execute(std::size_t i) {
    const Node& n = graph_.nodes()[i];
    if (storage_.values[i].is_view() || storage_.values[i].kind == ir::StorageKind::paged)
      return;  // reads its operand's storage, or its readers read the pages
    if (chunkwise(i)) return execute_chunkwise(i, out_ptr(i));
    // f16 and bf16 operands: widened into the scratch, or read as they are (reads_half).
    for (const auto& [v, at] : widened_[i]) {
      const auto u = static_cast<std::size_t>(v);
      widen_into(value_bytes(u), shapes_[u].numel(), reinterpret_cast<float*>(arena_bytes() + memory_.total_bytes + at));
    }
    auto in = [&](int k) {
      const ir::ValueId operand = n.inputs[static_cast<std::size_t>(k)];
      auto v = static_cast<std::size_t>(operand);
      if (const ir::ValueId gather = paged_source(operand); gather >= 0) return paged_operand(gather, shapes_[v]);
      const ConstBytes b = value_bytes(v);
      if (b.stored == DType::f32) return cpu::ConstView{static_cast<const float*>(b.data), shapes_[v]};
      for (const auto& [w, at] : widened_[i])
        if (w == operand) return cpu::ConstView{reinterpret_cast<const float*>(arena_bytes() + memory_.total_bytes + at), shapes_[v]};
      QKV_ASSERT(reads_half(n, static_cast<std::size_t>(k)), "a half operand neither widened nor read as it is");
      return cpu::ConstView{nullptr, shapes_[v], b.data, b.stored};
    };
    cpu::View out{nullptr, shapes_[i]};
    if (memory_.offset[i] >= 0) out.data = out_ptr(i);
    if (in_place_[i]) out.data = const_cast<float*>(static_cast<const float*>(value_bytes(i).data));  // the held cache
    const ir::ValueId round = storage_.values[i].into.into;
    if (round >= 0) {  // an attention writing its output rounded, where its round's value lives
      out = {nullptr, shapes_[i], arena_bytes() + memory_.offset[static_cast<std::size_t>(round)], storage_.held(round)};
    } else if (is_half(held(i))) {  // a round_f16 or round_bf16 writing its 16-bit value
      out = {nullptr, shapes_[i], out_ptr(i), held(i)};
    }
    if (n.op != Op::input && round < 0 && is_half(held(i))) return narrow_into(in(0), out);  // round_f16, round_bf16, a cast: into 16-bit storage
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
      case Op::embedding: return cpu::embedding(in(0), in(1), out);
      case Op::log_softmax: return cpu::log_softmax(in(0), n.attrs.axis, out);
      case Op::sink_softmax:  // decomposed (fused inside flex attention)
      case Op::reduce_mean: break;  // decomposed
      case Op::where: return cpu::select(in(0), in(1), in(2), out);
      QKV_REDUCE_CASES return cpu::reduce(n.op, in(0), n.attrs.axis, out);
      case Op::matmul: return cpu::matmul(in(0), in(1), n.attrs.transpose_a, n.attrs.transpose_b, out);
      case Op::permute: return cpu::permute(in(0), n.attrs.perm, out);
      case Op::reshape: return;  // aliases its operand's storage
      case Op::causal_mask: return cpu::causal_mask(n.attrs.align, n.attrs.window, out);
      case Op::slice: return cpu::slice(in(0), n.attrs.axis, n.attrs.begin, out);
      case Op::concat: return cpu::concat(in(0), in(1), n.attrs.axis, out);
      case Op::cache_write: return cpu::cache_write(in(0), in(1), in(2), n.attrs.axis, out);
      case Op::page_write: return cpu::page_write(in(0), in(1), in(2), out);
      case Op::page_gather: return cpu::page_gather(in(0), in(1), out);
      case Op::iota: return cpu::iota(n.attrs.axis, out);
      case Op::dropout_mask: return cpu::dropout_mask(in(1), n.attrs.dropout, out);
      case Op::softmax: return cpu::softmax(in(0), n.attrs.axis, out);
      QKV_ATTENTION_CASES return execute_attention(i, n, in, out);
    }
    // clang-format on
    QKV_UNREACHABLE("op");
  }

  cpu::TileCounter tiles_;                       // the running kernel's tiles
  std::vector<std::int64_t> bytes_;              // node -> its value's bytes, as planned
  std::vector<bool> in_place_;                   // node -> a cache_write or page_write into the held cache it updates
  std::vector<cpu::PagedRows> paged_rows_;       // node -> a paged page_gather's layout, as its readers last read it
  std::vector<std::vector<Widened>> widened_;    // node -> its operands widened into the scratch
  std::int64_t scratch_bytes_ = 0;               // after the arena's values
  std::vector<TileCount> tile_counts_;           // the last run's, per fused kernel
  std::vector<ir::ValueId> leader_;              // node -> its kernel group's leader, or -1
  std::vector<std::vector<std::size_t>> group_;  // leader -> its group's nodes (empty otherwise)
  std::vector<bool> group_fused_;                // leader -> the group runs as one kernel
  std::vector<int> slot_;                        // node -> index into tensors_ (inputs only)
  ir::StoragePlan storage_;                      // node -> how its value is held (cpu_storage_plan)
  // flex attention node -> its modifier, built for this plan
  std::vector<std::unique_ptr<cpu::ScoreModifier>> modifiers_;
  ir::MemoryPlan memory_;
  std::vector<float> arena_;
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::string device() const override {
    return "host CPU, qkv's vector kernels " + std::string(cpu::isa_name(cpu::host_isa())) + ", matmul by " + cpu::gemm_kernel_name() + ", " +
           std::string(openblas_get_config()) + ", " + std::to_string(cpu::ThreadPool::global().size()) +
           " threads (OpenBLAS on 1, qkv's pool owns the cores)";
  }
  bool supports(const Node& n) const override { return cpu_supports(n); }
  std::string determinism() const override {
    return "every kernel: the same bits every run and at any thread count (work split by data, each task writing its own outputs), "
           "and a sequence's the same alone or anywhere in a batch, a packed (varlen) batch's too (tiles from each sequence's start; "
           "not for ids interleaved so finely that the plain tiles are kept); not dropout's masks (keyed by the position in the batch)";
  }
  ir::StoragePlan storage_plan(const ir::Graph& g) const override { return cpu_storage_plan(g); }
  std::string work_split(const ir::Graph& g, ir::ValueId v, const std::vector<ir::Shape>& shapes) const override {
    const Node& node = g.node(v);
    if (node.op != Op::attention && node.op != Op::masked_attention && node.op != Op::flex_attention) return {};
    // Computed in its tangent's kernel (forward mode), which does not split the keys (where the
    // plan cannot give the pair apart storage they run apart, and this forward may split).
    if (static_cast<std::size_t>(v) + 1 < g.size() && ir::is_tangent_of(g.nodes()[static_cast<std::size_t>(v) + 1], node)) return {};
    const std::int64_t n = shapes[static_cast<std::size_t>(node.inputs[0])].back(1), m = shapes[static_cast<std::size_t>(node.inputs[1])].back(1);
    if (node.op == Op::flex_attention && m > cpu::kSplitKeys &&  // packed sequences: split by each one's own keys
        ir::has_document_mask(node, [&](ir::ValueId x) -> const ir::Shape& { return shapes[static_cast<std::size_t>(x)]; }))
      return "split-KV by packed sequence: a sequence with 1 to " + std::to_string(cpu::kSplitQueries) + " queries and more than " +
             std::to_string(cpu::kSplitKeys) + " keys (its document ids say which) has its keys in parts of " + std::to_string(cpu::kSplitKeys) +
             " from its first (a task each), merged by their log-sum-exp";
    const std::int64_t parts = cpu::key_splits(n, m);
    if (parts == 1) return {};
    return "split-KV: " + std::to_string(n) + (n == 1 ? " query" : " queries") + " against " + std::to_string(m) + " keys, in " +
           std::to_string(parts) + " parts of " + std::to_string(cpu::kSplitKeys) +
           " keys per batch entry (a task each), merged by their log-sum-exp";
  }
  std::string kernel_name(const ir::Graph& g, ir::ValueId v) const override {
    const Node& node = g.node(v);
    const ir::StoragePlan storage = cpu_storage_plan(g);
    if (node.op != Op::input && !storage.has_kernel(v)) return "(" + ir::no_kernel_reason(g, storage, v) + ")";
    if (node.op == Op::round_f16 || node.op == Op::round_bf16 || (node.op == Op::cast && is_half(node.dtype)))
      return "round to " + std::string(dtype_name(storage.held(v))) + ", stored in 16 bits";
    if (ir::attention_roles(node.op).forward()) {  // computed by its tangent's kernel (see kernel_groups)
      const auto groups = kernel_groups(g);
      for (std::size_t i = 0; i < groups.size(); ++i)
        if (groups[i].size() > 1 && groups[i][1] == static_cast<std::size_t>(v) && ir::attention_roles(g.nodes()[i].op).jvp())
          return "(in %" + std::to_string(i) + "'s kernel)";
    }
    // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
    // clang-format off
    switch (g.node(v).op) {
      case Op::input: return g.node(v).dtype == DType::f32 || is_half(g.node(v).dtype) ? "(input, read in place)" : "(input, widened to f32)";
      case Op::reshape: break;  // a view (above)
      case Op::matmul: return std::string(cpu::gemm_kernel_name()) + " (up to 4 rows of A as stored: one pass over B)";
      case Op::attention:
      case Op::masked_attention: return "fused attention (online softmax)";
      // The modifier is named: explain says what was fused.
      case Op::flex_attention: {
        const Node& n = g.node(v);
        return "fused flex attention (online softmax), mod = " + ir::region_expression(*n.region) +
               (n.attrs.sink ? ", with sinks" : "") + (n.attrs.dropout != 0.0 ? ", dropout " + ir::format_number(n.attrs.dropout) : "");
      }
      QKV_ATTENTION_JVP_CASES return "fused attention tangent (forward mode: the output and its tangent in one online-softmax pass)";
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
      case Op::page_gather: return "gather of pages through the block table (a reader other than attention's keys or values)";
      case Op::constant:
      QKV_UNARY_CASES
      QKV_BINARY_CASES
      QKV_SELECT_CASES
      QKV_COMPARE_CASES
      QKV_REDUCE_CASES
      QKV_MASK_CASES
      case Op::cast:
      case Op::permute:
      case Op::broadcast_to:
      case Op::slice:
      case Op::concat:
      case Op::cache_write:
      case Op::page_write:
      case Op::sink_softmax:
      case Op::reduce_mean: return "loop";
    }
    // clang-format on
    QKV_UNREACHABLE("an op without a kernel name");
  }
  std::unique_ptr<Executable> compile(const ir::Graph& g) override {
    cpu::ThreadPool::global();  // pins OpenBLAS to one thread before any sgemm runs
    // Half inputs are kept: their kernels read them in 16 bits (the half-precision boundary
    // widens only what the lowered graph declares f32).
    return half_precision_boundary(
        g,
        std::make_unique<CpuExecutable>(ir::lower_for_backend(
            g, [this](const Node& n) { return supports(n); }, ir::HalfInputs::kept)),
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
    case Op::sink_softmax:  // decomposed where flex attention does not hold it
    case Op::reduce_mean: return false;
    // The gradient of a modifier tensor (wrt >= 3) is score-shaped before its sum: decomposed.
    case Op::flex_attention_grad: return n.attrs.wrt <= 2;
    QKV_PRIMITIVE_CASES
    case Op::page_gather:  // read through its block table by the attention that reads it, else gathered
    case Op::attention:
    case Op::masked_attention:
    case Op::attention_lse:
    case Op::masked_attention_lse:
    case Op::attention_grad:
    case Op::masked_attention_grad:
    case Op::flex_attention:
    case Op::flex_attention_lse:
    QKV_ATTENTION_JVP_CASES return true;
  }
  // clang-format on
  return false;
}

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace qkv::backend
