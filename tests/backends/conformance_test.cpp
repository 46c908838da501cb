// Every op in the registry, every case it lists, on every backend, against the float64 reference.
#include <gtest/gtest.h>

#include "ir/op_cases.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

struct Param {
  testing::RegistryCase rc;
  std::string backend;
};

std::vector<Param> all_params() {
  std::vector<Param> r;
  for (const auto& rc : testing::registry_cases())
    for (const char* b : {"reference", "cpu", "vulkan"}) r.push_back({rc, b});
  return r;
}

class Conformance : public ::testing::TestWithParam<Param> {};

TEST_P(Conformance, MatchesFloat64Reference) {
  const Param& p = GetParam();
  ir::Graph g = ir::case_graph(p.rc.op, p.rc.c);
  testing::expect_equivalent(g, testing::case_inputs(p.rc.c, 1234 + p.rc.index), p.backend);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return testing::case_label(info.param.rc) + "_" + info.param.backend;
}

INSTANTIATE_TEST_SUITE_P(AllOps, Conformance, ::testing::ValuesIn(all_params()), param_name);

TEST(Conformance, EveryOpHasCases) {
  for (ir::Op op : ir::all_ops()) EXPECT_FALSE(ir::op_cases(op).empty()) << ir::op_name(op) << " has no test cases";
}

}  // namespace
}  // namespace qkv
