// The Vulkan kernels' storage plan (see storage_plan.hpp): each rule is what a kernel family can
// read or write in place, asked of the graph once per value.
#include "codegen/storage_plan.hpp"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "codegen/attention_glsl.hpp"
#include "codegen/glsl.hpp"
#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

using ir::Node;
using ir::Op;
using ir::StorageKind;
using ir::ValueId;

/// A permutation that keeps the last dim last: rows stay contiguous.
bool keeps_rows(const Node& n) { return n.op == Op::permute && n.attrs.perm[static_cast<std::size_t>(n.shape.rank - 1)] == n.shape.rank - 1; }

/// The dtype a round rounds to, f32 for any other op.
DType round_dtype(Op op) { return op == Op::round_f16 ? DType::f16 : op == Op::round_bf16 ? DType::bf16 : DType::f32; }

/// The rules, each a question about one value of one graph, with the graph's readers at hand.
class Planner {
 public:
  Planner(const ir::Graph& g, std::int64_t alignment, std::uint32_t storage_buffers)
      : g_(g), alignment_(alignment), storage_buffers_(storage_buffers), readers_(g.size()), result_(g.size(), false) {
    for (std::size_t i = 0; i < g.size(); ++i)
      for (std::size_t slot = 0; slot < g.nodes()[i].inputs.size(); ++slot)
        readers_[static_cast<std::size_t>(g.nodes()[i].inputs[slot])].emplace_back(static_cast<ValueId>(i), slot);
    for (ValueId v : g.result_values()) result_[static_cast<std::size_t>(v)] = true;
  }

  ir::StoragePlan plan() const;

 private:
  using Reader = std::pair<ValueId, std::size_t>;  // a node reading the value, and its operand slot

  const Node& node(ValueId v) const { return g_.node(v); }
  /// The nodes that read v, once per slot, in node order.
  const std::vector<Reader>& readers(ValueId v) const { return readers_[static_cast<std::size_t>(v)]; }
  bool is_result(ValueId v) const { return result_[static_cast<std::size_t>(v)]; }
  /// Whether one node reads v, once, and is no result; that node then.
  std::optional<ValueId> only_reader(ValueId v) const {
    if (is_result(v) || readers(v).size() != 1) return std::nullopt;
    return readers(v).front().first;
  }

  /// A slice's byte offset in its operand where its elements are a contiguous run of it there.
  std::optional<std::int64_t> slice_offset(ValueId v) const {
    const Node& n = node(v);
    if (n.op != Op::slice || alignment_ <= 0) return std::nullopt;
    const ir::Shape& in = node(n.inputs[0]).shape;
    std::int64_t inner = 1;
    for (int d = 0; d < in.rank; ++d) {
      if (d < n.attrs.axis && in[d] != 1) return std::nullopt;
      if (d > n.attrs.axis) {
        if (ir::is_symbol(in[d])) return std::nullopt;
        inner *= in[d];
      }
    }
    const std::int64_t bytes = n.attrs.begin * inner * 4;
    if (bytes % alignment_ != 0) return std::nullopt;
    return bytes;
  }

  /// The permute that is the only reader of flash-kernel output v (placed).
  ValueId placed_into(ValueId v) const {
    const Node& n = node(v);
    if (!ir::is_fused_attention(n.op) || !detail::attention_strided(n) || n.shape.rank < 2 || n.shape.back(0) == 1) return -1;
    const auto r = only_reader(v);
    return r && keeps_rows(node(*r)) ? *r : -1;
  }

  bool head_view(ValueId v) const {
    const Node& n = node(v);
    if (!keeps_rows(n) || is_result(v) || placed_into(n.inputs[0]) >= 0) return false;
    // Its operand is laid out contiguously: a kernel's result, an input, or reshapes of one.
    ValueId x = n.inputs[0];
    while (node(x).op == Op::reshape) x = node(x).inputs[0];
    if ((node(x).op == Op::permute && head_view(x)) || placed_into(x) >= 0) return false;
    return !readers(v).empty() && std::all_of(readers(v).begin(), readers(v).end(), [&](const Reader& r) {
      const Node& reader = node(r.first);
      return ir::is_fused_attention(reader.op) && detail::attention_strided(reader) && ir::attention_roles(reader.op).streamed(r.second);
    });
  }

  /// A page_gather that only flash kernels read, as keys or values, directly or through reshapes
  /// that keep its rows and their width (its leading index is then b H + h): they read the
  /// pages through the block table (attention_operands, flash_paged_row.glsl).
  bool paged(ValueId v) const { return node(v).op == Op::page_gather && ir::read_as_keys_or_values(g_, v) && rows_read_paged(v, v); }
  bool rows_read_paged(ValueId v, ValueId gather) const {
    return std::all_of(readers(v).begin(), readers(v).end(), [&](const Reader& r) {
      const Node& reader = node(r.first);
      // Its kernel binds up to two block tables more than its operands; attention's tangent reads
      // its tangents at its primals' offsets, so contiguous rows only.
      if (reader.op != Op::reshape)
        return detail::attention_fits(reader) && !ir::attention_roles(reader.op).jvp() &&
               (storage_buffers_ == 0 || static_cast<std::uint32_t>(storage_buffers(reader) + 2) <= storage_buffers_);
      const ir::Shape &s = reader.shape, &rows = node(gather).shape;
      return s.rank >= 2 && s.back(0) == rows.back(0) && s.back(1) == rows.back(1) && rows_read_paged(r.first, gather);
    });
  }

  bool half_view(ValueId v) const {
    const Node& n = node(v);
    if (n.op != Op::cast || n.dtype != DType::f32 || !is_half(node(n.inputs[0]).dtype) || node(n.inputs[0]).op != Op::input || is_result(v))
      return false;
    return !readers(v).empty() && std::all_of(readers(v).begin(), readers(v).end(), [&](const Reader& r) {
      const Node& reader = node(r.first);
      if (reader.op == Op::matmul) return r.second < 2;
      if (reader.op == Op::page_gather) return r.second == 0 && paged(r.first);  // pages the flash kernels read in place
      if (ir::is_fused_attention(reader.op)) return ir::attention_roles(reader.op).streamed(r.second) && detail::attention_fits(reader);
      return (elementwise(g_, reader) && !exact_round(r.first)) || axis_reduction(reader);  // a kernel, not a view, reads it
    });
  }

  /// The 16-bit cast that is v's only reader, which v's kernel writes rounded (narrowed).
  ValueId narrowed_into(ValueId v) const {
    const Node& n = node(v);
    const bool flash = (ir::attention_roles(n.op).forward() || ir::attention_roles(n.op).jvp()) && detail::attention_fits(n);
    // An elementwise node or reduction read only by the cast is the root of its kernel (a cast16
    // reads its operand from memory), unless it is a view.
    const bool stores = (elementwise(g_, n) || axis_reduction(n)) && !exact_round(v) && !half_view(v);
    if (!flash && !stores && n.op != Op::matmul) return -1;
    const auto r = only_reader(v);
    return r && node(*r).op == Op::cast && is_half(node(*r).dtype) ? *r : -1;
  }

  DType held_dtype(ValueId v) const {
    if (is_half(node(v).dtype)) return node(v).dtype;
    if (const ValueId c = narrowed_into(v); c >= 0) return node(c).dtype;
    return half_view(v) ? node(node(v).inputs[0]).dtype : DType::f32;
  }

  /// f16 or bf16 where v's kernel stores its values rounded to that dtype for its one round.
  DType rounded_on_store(ValueId v) const {
    const Node& n = node(v);
    const bool flash = ir::is_fused_attention(n.op) && detail::attention_fits(n);
    const bool axis = axis_reduction(n);
    const auto r = only_reader(v);
    if ((!flash && !axis) || !r || !is_half(round_dtype(node(*r).op))) return DType::f32;
    if (axis && n.op != Op::softmax && n.attrs.keepdim)
      for (const Reader& reader : readers(*r))
        if (elementwise(g_, node(reader.first)) || cast16(g_, node(reader.first))) return DType::f32;  // fusion may compute it per row
    return round_dtype(node(*r).op);
  }

  /// Whether every value of v is a `dtype` (f16 or bf16) number.
  bool rounded_to(ValueId v, DType dtype) const {
    const Node& n = node(v);
    if (n.dtype == dtype || round_dtype(n.op) == dtype) return true;
    if (is_half(dtype) && rounded_on_store(v) == dtype) return true;
    if (n.op == Op::neg) return rounded_to(n.inputs[0], dtype);  // a sign change keeps a half number one
    // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
    // clang-format off
    switch (n.op) {
      case Op::cast: return node(n.inputs[0]).dtype == dtype;
      case Op::reshape:
      case Op::permute:
      case Op::slice:
      case Op::broadcast_to: return rounded_to(n.inputs[0], dtype);
      case Op::concat: return rounded_to(n.inputs[0], dtype) && rounded_to(n.inputs[1], dtype);
      case Op::where: return rounded_to(n.inputs[1], dtype) && rounded_to(n.inputs[2], dtype);
      case Op::cache_write:
      case Op::page_write:
      // The other unary ops compute new values (neg is above; the rounds of the other half dtype:
      // their own is above), as do the rest (or they hold an input as it came).
      QKV_UNARY_CASES QKV_SOURCE_CASES QKV_BINARY_CASES QKV_COMPARE_CASES QKV_REDUCE_CASES QKV_CONTRACT_CASES QKV_MASK_CASES
      QKV_COMPOSITE_CASES QKV_ATTENTION_CASES return false;
    }
    // clang-format on
    QKV_UNREACHABLE("op");
  }

  /// Whether round v is the identity on values already of its dtype held in storage anyway.
  bool exact_round(ValueId v) const {
    const Node& n = node(v);
    const DType dtype = round_dtype(n.op);
    if (!is_half(dtype)) return false;
    if (rounded_on_store(n.inputs[0]) == dtype) return true;  // its operand's kernel rounds
    // Only of a value stored anyway (an elementwise operand is cheaper computed inside the
    // kernels that read the round, as a round of it is). Laid out by hand (case lists).
    const Op of = node(n.inputs[0]).op;
    if (is_half(round_dtype(of))) return rounded_to(n.inputs[0], dtype);
    // clang-format off
    switch (of) {
      case Op::reshape:
      case Op::permute:
      case Op::slice:
      case Op::concat:
      case Op::cast: return rounded_to(n.inputs[0], dtype);
      case Op::broadcast_to: case Op::cache_write: case Op::page_write:
      QKV_UNARY_CASES QKV_SOURCE_CASES QKV_BINARY_CASES QKV_SELECT_CASES QKV_COMPARE_CASES QKV_REDUCE_CASES QKV_CONTRACT_CASES QKV_MASK_CASES
      QKV_COMPOSITE_CASES QKV_ATTENTION_CASES return false;
    }
    // clang-format on
    QKV_UNREACHABLE("op");
  }

  /// Where v aliases its operand's storage without a kernel, in bytes (a view).
  std::optional<std::int64_t> view_offset(ValueId v) const {
    if (node(v).op == Op::reshape || head_view(v) || half_view(v) || exact_round(v)) return 0;
    return slice_offset(v);
  }

  /// The concats that read v.
  std::vector<ValueId> concat_readers(ValueId v) const {
    std::vector<ValueId> r;
    for (const Reader& read : readers(v))
      if (node(read.first).op == Op::concat && (r.empty() || r.back() != read.first)) r.push_back(read.first);
    return r;
  }

  bool concat_in_place(ValueId v) const {
    const Node& c = node(v);
    if (c.op != Op::concat || alignment_ <= 0 || c.inputs[0] == c.inputs[1]) return false;
    // Each operand is a contiguous run of the result: every dim before the axis is 1, and the
    // second operand starts at an aligned static offset.
    for (int d = 0; d < c.shape.rank; ++d)
      if (ir::is_symbol(c.shape[d]) || (d < c.attrs.axis && c.shape[d] != 1)) return false;
    if (node(c.inputs[0]).shape.numel() * 4 % alignment_ != 0) return false;
    for (ValueId o : c.inputs) {
      const Node& operand = node(o);
      // Its own storage, written by its kernel (or by its operands', for a concat in place), and
      // this the only concat that reads it.
      const bool own = operand.op == Op::concat ? concat_in_place(o) : has_kernel(o) && placed_into(o) < 0;
      if (operand.op == Op::input || !own || concat_readers(o).size() != 1) return false;
    }
    return true;
  }

  /// Where v's kernel writes its result when that lies in a later value's storage.
  ir::Placement written_into(ValueId v) const {
    if (const ValueId p = placed_into(v); p >= 0) return {p, 0};
    if (const ValueId c = narrowed_into(v); c >= 0) return {c, 0};
    for (ValueId c : concat_readers(v))
      if (concat_in_place(c)) return {c, node(c).inputs[0] == v ? 0 : node(node(c).inputs[0]).shape.numel() * 4};
    return {};
  }

  bool has_kernel(ValueId v) const {
    const Node& n = node(v);
    if (n.op == Op::input || n.op == Op::reshape || paged(v)) return false;
    if (n.op == Op::permute && placed_into(n.inputs[0]) == v) return false;  // its operand's kernel writes it
    if (n.op == Op::cast && narrowed_into(n.inputs[0]) == v) return false;   // likewise, rounded
    return !concat_in_place(v) && !view_offset(v);                           // its operands' kernels write it, or a view
  }

  /// The kind of v's storage.
  StorageKind kind(ValueId v) const {
    const Node& n = node(v);
    if (n.op == Op::input) return StorageKind::input;
    if (n.op == Op::reshape) return StorageKind::reshape;
    if (has_kernel(v)) return ir::writes_into_operand(g_, v) ? StorageKind::in_place : StorageKind::kernel;
    if (n.op == Op::permute && placed_into(n.inputs[0]) == v) return StorageKind::placed;
    if (n.op == Op::cast && narrowed_into(n.inputs[0]) == v) return StorageKind::narrowed;
    if (n.op == Op::concat) return StorageKind::concat;
    if (paged(v)) return StorageKind::paged;
    if (head_view(v)) return StorageKind::head_view;
    if (half_view(v)) return StorageKind::half_view;
    if (exact_round(v)) return StorageKind::exact_round;
    return StorageKind::slice;
  }

  const ir::Graph& g_;
  std::int64_t alignment_;
  std::uint32_t storage_buffers_;
  std::vector<std::vector<Reader>> readers_;
  std::vector<bool> result_;
};

ir::StoragePlan Planner::plan() const {
  ir::StoragePlan plan;
  plan.view_alignment = alignment_;
  plan.values.resize(g_.size());
  for (std::size_t i = 0; i < g_.size(); ++i) {
    const auto v = static_cast<ValueId>(i);
    ir::ValueStorage& s = plan.values[i];
    s.kind = kind(v);
    s.held = held_dtype(v);
    s.rounded = rounded_on_store(v);
    if (s.kind != StorageKind::kernel && s.kind != StorageKind::input) s.of = node(v).inputs[0];
    if (s.kind == StorageKind::slice) s.offset = *slice_offset(v);
    if (s.has_kernel() || s.kind == StorageKind::concat) s.into = written_into(v);
    s.f16_numbers = rounded_to(v, DType::f16);
    s.bf16_numbers = rounded_to(v, DType::bf16);
  }
  ir::verify_storage(g_, plan);
  return plan;
}

}  // namespace

ir::StoragePlan plan_storage(const ir::Graph& g, std::int64_t view_alignment, std::uint32_t storage_buffers) {
  return Planner(g, view_alignment, storage_buffers).plan();
}

}  // namespace qkv::codegen
