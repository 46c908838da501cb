// The storage plan's record, its text and its checks (the planners are the backends').
#include "ir/storage_plan.hpp"

#include <algorithm>

#include "ir/error.hpp"

namespace qkv::ir {

namespace {

std::string value_name(ValueId v) { return "%" + std::to_string(v); }

/// The dtype a round or cast rounds its values to.
DType rounds_to(const Node& n) { return n.op == Op::round_f16 ? DType::f16 : n.op == Op::round_bf16 ? DType::bf16 : n.dtype; }

}  // namespace

std::string_view storage_kind_name(StorageKind kind) {
  switch (kind) {
    case StorageKind::kernel: return "kernel";
    case StorageKind::input: return "input";
    case StorageKind::in_place: return "in_place";
    case StorageKind::reshape: return "reshape";
    case StorageKind::slice: return "slice";
    case StorageKind::head_view: return "head_view";
    case StorageKind::half_view: return "half_view";
    case StorageKind::exact_round: return "exact_round";
    case StorageKind::placed: return "placed";
    case StorageKind::narrowed: return "narrowed";
    case StorageKind::concat: return "concat";
    case StorageKind::paged: return "paged";
  }
  QKV_UNREACHABLE("storage kind");
}

bool ValueStorage::is_view() const {
  switch (kind) {
    case StorageKind::reshape:
    case StorageKind::slice:
    case StorageKind::head_view:
    case StorageKind::half_view:
    case StorageKind::exact_round: return true;
    case StorageKind::kernel:
    case StorageKind::input:
    case StorageKind::in_place:
    case StorageKind::placed:
    case StorageKind::narrowed:
    case StorageKind::concat:
    case StorageKind::paged: return false;
  }
  QKV_UNREACHABLE("storage kind");
}

std::vector<std::int64_t> StoragePlan::memory_views() const {
  std::vector<std::int64_t> views(values.size(), -1);
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i].is_view() || values[i].kind == StorageKind::in_place) views[i] = values[i].offset;
  return views;
}

std::vector<Placement> StoragePlan::memory_placements() const {
  std::vector<Placement> placed(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) placed[i] = values[i].into;
  return placed;
}

StoragePlan plain_storage_plan(const Graph& g) {
  StoragePlan plan;
  plan.values.resize(g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    ValueStorage& s = plan.values[i];
    if (n.op == Op::input) s.kind = StorageKind::input;
    if (n.op == Op::reshape) {
      s.kind = StorageKind::reshape;
      s.of = n.inputs[0];
    }
    s.held = is_half(n.dtype) ? n.dtype : n.op == Op::reshape ? plan[n.inputs[0]].held : DType::f32;
    s.f16_numbers = n.dtype == DType::f16 || n.op == Op::round_f16;
    s.bf16_numbers = n.dtype == DType::bf16 || n.op == Op::round_bf16;
  }
  return plan;
}

bool read_as_keys_or_values(const Graph& g, ValueId v) {
  for (ValueId r : g.result_values())
    if (r == v) return false;
  bool read = false;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    const AttentionRoles& roles = attention_roles(n.op);
    for (std::size_t k = 0; k < n.inputs.size(); ++k) {
      if (n.inputs[k] != v) continue;
      read = true;
      const bool keys_or_values = roles.attention() && (static_cast<int>(k) == roles.k || static_cast<int>(k) == roles.v);
      if (!keys_or_values && !(n.op == Op::reshape && read_as_keys_or_values(g, static_cast<ValueId>(i)))) return false;
    }
  }
  return read;
}

std::string no_kernel_reason(const Graph& g, const StoragePlan& plan, ValueId v) {
  const ValueStorage& s = plan[v];
  const Node& n = g.node(v);
  const std::string of = value_name(s.of);
  switch (s.kind) {
    case StorageKind::kernel:
    case StorageKind::in_place: return {};
    case StorageKind::input: return "input";
    case StorageKind::reshape: return "view of " + of;
    case StorageKind::slice: return "view of " + of + (s.offset ? " at byte " + std::to_string(s.offset) : "");
    case StorageKind::head_view: return "view of " + of + " read through strides";
    case StorageKind::half_view: return "view of " + of + ", its " + std::string(dtype_name(plan.held(s.of))) + " values widened where read";
    case StorageKind::exact_round:
      if (plan[s.of].rounded == rounds_to(n) && plan[s.of].has_kernel())
        return "view of " + of + ", whose kernel stores its values rounded to " + std::string(dtype_name(rounds_to(n)));
      return "view of " + of + ", whose values are already " + std::string(dtype_name(rounds_to(n))) + " numbers";
    case StorageKind::placed: return "written in place by " + of + "'s kernel through its strides";
    case StorageKind::narrowed: return "written in place by " + of + "'s kernel, rounded to " + std::string(dtype_name(rounds_to(n)));
    case StorageKind::concat: return "written in place by " + value_name(n.inputs[0]) + "'s and " + value_name(n.inputs[1]) + "'s kernels";
    case StorageKind::paged: return "pages read through the block table " + value_name(n.inputs[1]) + " by the attention kernels that read it";
  }
  QKV_UNREACHABLE("storage kind");
}

std::string print_storage(const Graph& g, const StoragePlan& plan) {
  std::string out;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto v = static_cast<ValueId>(i);
    const ValueStorage& s = plan[v];
    out += value_name(v) + " = " + std::string(op_name(g.node(v).op)) + " : " + g.type_string(v) + "  held " + std::string(dtype_name(s.held)) + "  ";
    out += s.has_kernel() ? std::string(s.kind == StorageKind::in_place ? "kernel, in its operand's storage" : "kernel")
                          : "no kernel: " + no_kernel_reason(g, plan, v);
    if (is_half(s.rounded)) out += ", rounded to " + std::string(dtype_name(s.rounded)) + " as stored";
    if (s.into.into >= 0) out += ", written into " + value_name(s.into.into) + (s.into.at ? " at byte " + std::to_string(s.into.at) : "");
    out += "\n";
  }
  return out;
}

void verify_storage(const Graph& g, const StoragePlan& plan) {
  if (plan.values.size() != g.size())
    throw IrError("storage plan: " + std::to_string(plan.values.size()) + " values for a graph of " + std::to_string(g.size()));
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto v = static_cast<ValueId>(i);
    const Node& n = g.node(v);
    const ValueStorage& s = plan[v];
    auto fail = [&](const std::string& why) {
      throw IrError("storage plan: " + value_name(v) + " " + std::string(op_name(n.op)) + " (" + std::string(storage_kind_name(s.kind)) +
                    "): " + why);
    };
    if ((s.kind == StorageKind::input) != (n.op == Op::input)) fail("inputs, and only inputs, are the caller's");
    if ((s.kind == StorageKind::reshape) != (n.op == Op::reshape)) fail("reshapes, and only reshapes, are reshape views");
    if (s.is_view() || s.kind == StorageKind::in_place || s.kind == StorageKind::placed || s.kind == StorageKind::narrowed) {
      if (n.inputs.empty() || s.of != n.inputs[0]) fail("it reads or is written by its first operand, not " + value_name(s.of));
      if (s.offset < 0 || (s.offset > 0 && s.kind != StorageKind::slice)) fail("offset " + std::to_string(s.offset));
    }
    if (s.kind == StorageKind::placed || s.kind == StorageKind::narrowed)
      if (plan[s.of].into.into != v) fail(value_name(s.of) + " does not write into it");
    if (s.kind == StorageKind::paged && (n.op != Op::page_gather || !read_as_keys_or_values(g, v)))
      fail("only a page_gather that attention kernels alone read is read through its block table");
    if (s.kind == StorageKind::concat) {
      if (n.op != Op::concat) fail("only a concat is written by its operands");
      for (ValueId o : n.inputs)
        if (plan[o].into.into != v) fail("operand " + value_name(o) + " does not write into it");
    }
    if (const ValueId into = s.into.into; into >= 0) {
      if (into <= v || static_cast<std::size_t>(into) >= g.size()) fail("written into " + value_name(into) + ", not a later value");
      const StorageKind k = plan[into].kind;
      if (k != StorageKind::placed && k != StorageKind::narrowed && k != StorageKind::concat)
        fail("written into " + value_name(into) + ", which has storage of its own");
      if (!s.has_kernel() && s.kind != StorageKind::concat) fail("written into " + value_name(into) + " by no kernel");
    }
  }
}

}  // namespace qkv::ir
