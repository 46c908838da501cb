// Attributes come from one list (QKV_ATTRS in ir/op.hpp): every field takes part in equality and
// hashing (printing and parsing back: Printer.RoundTripsEveryOpCase).
#include <gtest/gtest.h>

#include <limits>

#include "ir/graph.hpp"
#include "ir/op.hpp"

namespace qkv::ir {
namespace {

// A value other than the default, per attribute type.
int changed(int v) { return v + 1; }
std::int64_t changed(std::int64_t v) { return v + 1; }
std::int8_t changed(std::int8_t v) { return static_cast<std::int8_t>(v + 1); }
bool changed(bool v) { return !v; }
double changed(double v) { return v + 0.5; }
Shape changed(Shape v) {
  v.push_back(3);
  return v;
}
Perm changed(Perm v) {
  v[0] = 1;
  return v;
}
CausalAlign changed(CausalAlign v) { return v == CausalAlign::top_left ? CausalAlign::bottom_right : CausalAlign::top_left; }
DType changed(DType v) { return v == DType::f32 ? DType::i32 : DType::f32; }

TEST(Attributes, EveryFieldTakesPartInEqualityAndHashing) {
  const Attrs defaults;
  int fields = 0;
#define QKV_CHECK_ATTR(field, type, init, flag, print, kind)                                                      \
  {                                                                                                               \
    Attrs a;                                                                                                      \
    a.field = changed(a.field);                                                                                   \
    EXPECT_FALSE(a == defaults) << #field;                                                                        \
    EXPECT_NE(node_hash(Op::constant, {}, a, nullptr), node_hash(Op::constant, {}, defaults, nullptr)) << #field; \
    ++fields;                                                                                                     \
  }
  QKV_ATTRS(QKV_CHECK_ATTR)
#undef QKV_CHECK_ATTR
  EXPECT_EQ(fields, 19);
  Attrs nan;
  nan.value = std::numeric_limits<double>::quiet_NaN();
  Attrs nan2 = nan;
  EXPECT_TRUE(nan == nan2);  // a NaN constant is one node
  EXPECT_EQ(node_hash(Op::constant, {}, nan, nullptr), node_hash(Op::constant, {}, nan2, nullptr));
}

}  // namespace
}  // namespace qkv::ir
