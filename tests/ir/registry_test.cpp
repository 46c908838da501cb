// The registry's columns that passes and backends read instead of naming ops: the autocast
// policy, the attention family's operand roles, and which attributes an op reads.
#include <gtest/gtest.h>

#include <set>

#include "ir/graph.hpp"
#include "ir/op.hpp"
#include "ir/passes/passes.hpp"
#include "sweeps/op_cases.hpp"

namespace qkv::ir {
namespace {

/// The operand of `n` at `role`, as a node of `g`.
const Node& operand(const Graph& g, const Node& n, int role) { return g.node(n.inputs[static_cast<std::size_t>(role)]); }

TEST(Registry, AttentionRolesNameTheOperandsOfEveryCase) {
  int checked = 0;
  for (Op op : all_ops()) {
    const AttentionRoles& r = attention_roles(op);
    EXPECT_EQ(r.attention(), is_fused_attention(op)) << op_name(op);
    if (!r.attention()) continue;
    // Distinct operands among the fixed ones.
    std::set<int> at;
    const int tangents[3] = {r.tangent, r.jvp() ? r.tangent + 1 : -1, r.jvp() ? r.tangent + 2 : -1};
    for (int i : {int{r.q}, int{r.k}, int{r.v}, int{r.mask}, int{r.dy}, int{r.lse}, int{r.delta}, tangents[0], tangents[1], tangents[2]})
      if (i >= 0) {
        EXPECT_TRUE(at.insert(i).second) << op_name(op) << ": operand " << i << " has two roles";
        EXPECT_LT(static_cast<std::size_t>(i), fixed_operands(op)) << op_name(op);
      }
    EXPECT_EQ(at.size(), fixed_operands(op)) << op_name(op) << ": a fixed operand with no role";
    for (const auto& c : op_cases(op)) {
      const Graph g = case_graph(op, c);
      const Node& n = g.node(g.output("out"));
      SCOPED_TRACE(std::string(op_name(op)) + " " + c.label);
      const Node& q = operand(g, n, r.q);
      EXPECT_TRUE(is_float(q.dtype));
      EXPECT_EQ(operand(g, n, r.k).shape.back(0), q.shape.back(0)) << "q and k share the head dim";
      if (r.mask >= 0) {
        EXPECT_EQ(operand(g, n, r.mask).dtype, DType::boolean);
      }
      if (r.backward()) {
        EXPECT_EQ(operand(g, n, r.dy).shape.back(0), operand(g, n, r.v).shape.back(0)) << "dy is the output's gradient";
        EXPECT_EQ(operand(g, n, r.lse).shape.back(0), 1) << "one statistic per row";
        EXPECT_EQ(operand(g, n, r.delta).shape.back(0), 1) << "one statistic per row";
      }
      if (r.jvp())  // each tangent of its primal's dtype and shape
        for (int k : {0, 1, 2}) {
          EXPECT_EQ(operand(g, n, r.tangent + k).dtype, operand(g, n, k == 0 ? r.q : k == 1 ? r.k : r.v).dtype);
          EXPECT_EQ(operand(g, n, r.tangent + k).shape, operand(g, n, k == 0 ? r.q : k == 1 ? r.k : r.v).shape);
        }
      for (std::size_t i = 0; i < n.inputs.size(); ++i) {
        const auto role = static_cast<int>(i);
        EXPECT_EQ(r.streamed(i), role == r.q || role == r.k || role == r.v || role == r.dy || (r.jvp() && role >= r.tangent && role < r.tangent + 3));
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 40);
}

TEST(Registry, AutocastPolicyIsTheColumnsAndTouchesOnlyItsOperands) {
  for (Op op : all_ops()) {
    const Autocast a = op_info(op).autocast;
    if (op == Op::input || op == Op::constant || op == Op::cast) {
      EXPECT_EQ(a, Autocast::keep) << op_name(op);
    }
    if (a == Autocast::lower) {
      EXPECT_TRUE(op == Op::matmul || attention_roles(op).forward()) << op_name(op);
    }
  }
  Graph g;
  const ValueId x = g.add_input("x", DType::f32, {4, 8}), h = g.add_input("h", DType::f16, {4, 8});
  const ValueId keep = g.add_input("keep", DType::boolean, {4, 4});
  Attrs transposed;
  transposed.transpose_b = true;
  g.set_output("mm", g.add(Op::matmul, {x, x}, transposed));  // lower: both operands in f16
  g.set_output("exp", g.add(Op::exp, {h}));                   // f32: its half operand widened
  g.set_output("same", g.add(Op::add, {h, h}));               // promote, one dtype: as it is
  Attrs scaled;
  scaled.scale = 0.25;
  g.set_output("att", g.add(Op::masked_attention, {x, x, x, keep}, scaled));  // lower: q, k, v; the mask as it is
  const Graph a = autocast(g, DType::f16);
  auto operand_dtypes = [&](const std::string& output) {
    std::vector<DType> d;
    for (ValueId v : a.node(a.output(output)).inputs) d.push_back(a.node(v).dtype);
    return d;
  };
  EXPECT_EQ(operand_dtypes("mm"), (std::vector<DType>{DType::f16, DType::f16}));
  EXPECT_EQ(operand_dtypes("exp"), (std::vector<DType>{DType::f32}));
  EXPECT_EQ(operand_dtypes("same"), (std::vector<DType>{DType::f16, DType::f16}));
  EXPECT_EQ(operand_dtypes("att"), (std::vector<DType>{DType::f16, DType::f16, DType::f16, DType::boolean}));
}

TEST(Registry, AnOpRefusesEveryAttributeItDoesNotRead) {
  // Each attribute, set away from its default, on each op: refused unless the op reads it.
  int refused = 0;
  for (Op op : all_ops()) {
#define QKV_TRY_ATTR(field, type, init, flag, print, kind)                             \
  {                                                                                    \
    Attrs a;                                                                           \
    a.field = Attrs{}.field == type{} ? type{1} : type{};                              \
    const bool reads = (op_info(op).attrs & (flag)) != 0;                              \
    EXPECT_EQ(unread_attribute(op, a).empty(), reads) << op_name(op) << " " << #field; \
    refused += !reads;                                                                 \
  }
    if (op == Op::input) continue;  // its attributes are its type (add_input)
    QKV_TRY_ATTR(value, double, 0.0, kAttrValue, always, number)
    QKV_TRY_ATTR(scale, double, 0.0, kAttrScale, always, number)
    QKV_TRY_ATTR(dropout, double, 0.0, kAttrDropout, when_set, number)
    QKV_TRY_ATTR(axis, int, 0, kAttrAxis, always, axis)
    QKV_TRY_ATTR(window, std::int64_t, 0, kAttrWindow, when_set, size)
    QKV_TRY_ATTR(causal, bool, false, kAttrCausal, always, boolean)
#undef QKV_TRY_ATTR
  }
  EXPECT_GT(refused, 200);
  Graph g;
  const ValueId q = g.add_input("q", DType::f32, {2, 3});
  Attrs a;
  a.value = 0.5;
  try {
    g.add(Op::attention, {q, q, q}, a);
    ADD_FAILURE() << "attention took a value";
  } catch (const IrError& e) {
    EXPECT_STREQ(e.what(),
                 "attention: has no attribute 'value' (it reads scale, rsqrt_of, causal, align, window); an attention op's scale is its 'scale'");
  }
}

}  // namespace
}  // namespace qkv::ir
