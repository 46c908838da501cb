// Every op in the registry, every case it lists, on every backend, against the float64 reference.
#include <gtest/gtest.h>

#include "ir/op_cases.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

struct Param {
  ir::Op op;
  std::size_t index;
  ir::OpCase c;
  std::string backend;
};

std::vector<Param> all_params() {
  std::vector<Param> r;
  for (ir::Op op : ir::all_ops()) {
    auto cases = ir::op_cases(op);
    for (std::size_t i = 0; i < cases.size(); ++i)
      for (const char* b : {"reference", "cpu", "vulkan"}) r.push_back({op, i, cases[i], b});
  }
  return r;
}

class Conformance : public ::testing::TestWithParam<Param> {};

TEST_P(Conformance, MatchesFloat64Reference) {
  const Param& p = GetParam();
  ir::Graph g = ir::case_graph(p.op, p.c);
  testing::expect_equivalent(g, testing::case_inputs(p.c, 1234 + p.index), p.backend);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::string s = std::string(ir::op_name(info.param.op)) + "_" + std::to_string(info.param.index) + "_" + info.param.backend;
  return s;
}

INSTANTIATE_TEST_SUITE_P(AllOps, Conformance, ::testing::ValuesIn(all_params()), param_name);

TEST(Conformance, EveryOpHasCases) {
  for (ir::Op op : ir::all_ops()) EXPECT_FALSE(ir::op_cases(op).empty()) << ir::op_name(op) << " has no test cases";
}

}  // namespace
}  // namespace qkv
