// Moves each attention_lse next to the attention with its operands and attributes.
#include "ir/passes/passes.hpp"

namespace qkv::ir {

Graph place_attention_lse(const Graph& g) {
  // The row statistics attention's backward asks for, by the forward node they belong to.
  auto lse_of = [](Op op) { return op == Op::attention ? Op::attention_lse : Op::masked_attention_lse; };
  auto operands = [](const Node& attention) {
    std::vector<ValueId> qk = {attention.inputs[0], attention.inputs[1]};
    if (attention.op == Op::masked_attention) qk.push_back(attention.inputs[3]);
    return qk;
  };
  std::vector<bool> wanted(g.size(), false);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op != Op::attention && n.op != Op::masked_attention) continue;
    for (std::size_t j = i + 1; j < g.size(); ++j) {
      const Node& s = g.nodes()[j];
      if (s.op == lse_of(n.op) && s.inputs == operands(n) && s.attrs == n.attrs) wanted[i] = true;
    }
  }
  std::size_t at = 0;  // rebuild visits the nodes in order
  return rebuild(g, [&](Graph& out, const Node& n, std::span<const ValueId> in) -> ValueId {
    if (!wanted[at++]) return -1;
    ValueId y = out.add_like(n, std::vector<ValueId>(in.begin(), in.end()));
    std::vector<ValueId> qk = {in[0], in[1]};
    if (n.op == Op::masked_attention) qk.push_back(in[3]);
    out.add(lse_of(n.op), qk, n.attrs);  // the original, copied later, is shared with this one
    return y;
  });
}

}  // namespace qkv::ir
