// Moves each attention_lse, and each attention's tangent, next to the attention with its operands
// and attributes.
#include <algorithm>

#include "ir/error.hpp"
#include "ir/passes/passes.hpp"
#include "ir/region.hpp"

namespace qkv::ir {

LseCall lse_of(const Node& attention) {
  Attrs a = attention.attrs;
  a.dropout = 0.0;
  // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
  // clang-format off
  switch (attention.op) {
    case Op::attention: return {Op::attention_lse, {attention.inputs[0], attention.inputs[1]}, a};
    case Op::masked_attention: return {Op::masked_attention_lse, {attention.inputs[0], attention.inputs[1], attention.inputs[3]}, a};
    case Op::flex_attention: {
      LseCall c{Op::flex_attention_lse, {attention.inputs[0], attention.inputs[1]}, a};
      const auto tensors = attention.inputs.begin() + 3;
      c.inputs.insert(c.inputs.end(), tensors, tensors + static_cast<std::ptrdiff_t>(modifier_tensor_count(attention.op, attention.attrs, attention.inputs.size())));
      if (has_sink(attention.op, attention.attrs)) c.inputs.push_back(attention.inputs[sink_operand(attention.op, attention.attrs, attention.inputs.size())]);
      return c;
    }
    QKV_PRIMITIVE_CASES
    QKV_COMPOSITE_CASES
    QKV_ATTENTION_BACKWARD_CASES
    QKV_ATTENTION_JVP_CASES break;
  }
  // clang-format on
  QKV_UNREACHABLE(std::string(op_name(attention.op)) + " has no attention_lse");
}

bool is_tangent_of(const Node& t, const Node& attention) {
  const Node& n = attention;
  return t.op == tangent_op(n.op) && t.inputs.size() == n.inputs.size() + 3 && t.attrs == n.attrs && same_region(t.region.get(), n.region.get()) &&
         std::equal(n.inputs.begin(), n.inputs.begin() + 3, t.inputs.begin()) &&
         std::equal(n.inputs.begin() + 3, n.inputs.end(), t.inputs.begin() + 6);
}

namespace {

bool is_forward_attention(Op op) { return op == Op::attention || op == Op::masked_attention || op == Op::flex_attention; }

}  // namespace

Graph place_attention_lse(const Graph& g) {
  // The row statistics attention's backward asks for, and its tangent (forward mode) where every
  // operand of the tangent comes before it, by the forward node they belong to.
  std::vector<bool> wanted(g.size(), false);
  std::vector<ValueId> tangent(g.size(), -1);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!is_forward_attention(n.op)) continue;
    const LseCall lse = lse_of(n);
    for (std::size_t j = i + 1; j < g.size(); ++j) {
      const Node& s = g.nodes()[j];
      if (s.op == lse.op && s.inputs == lse.inputs && s.attrs == lse.attrs && same_region(s.region.get(), n.region.get())) wanted[i] = true;
      auto before = [&] { return std::all_of(s.inputs.begin(), s.inputs.end(), [&](ValueId v) { return static_cast<std::size_t>(v) < i; }); };
      if (tangent[i] < 0 && is_tangent_of(s, n) && before()) tangent[i] = static_cast<ValueId>(j);
    }
  }
  std::size_t at = 0;  // rebuild visits the nodes in order
  std::vector<ValueId> map;
  return rebuild(
      g,
      [&](Graph& out, ValueId, const Node& n, std::span<const ValueId> in) -> ValueId {
        const std::size_t i = at++;
        if (!wanted[i] && tangent[i] < 0) return -1;
        Node mapped = n;
        mapped.inputs.assign(in.begin(), in.end());
        const ValueId y = out.add_like(mapped, mapped.inputs);
        // The originals, copied later, are shared with these.
        if (tangent[i] >= 0) {
          const Node& t = g.node(tangent[i]);
          std::vector<ValueId> operands;
          for (ValueId v : t.inputs) operands.push_back(map[static_cast<std::size_t>(v)]);
          out.add(t.op, std::move(operands), t.attrs, t.region);
        }
        if (wanted[i]) {
          const LseCall lse = lse_of(mapped);
          out.add(lse.op, lse.inputs, lse.attrs, n.region);
        }
        return y;
      },
      &map);
}

}  // namespace qkv::ir
