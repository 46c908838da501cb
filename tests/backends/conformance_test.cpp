// Every op in the registry, every case it lists, on every backend, against the float64 reference.
#include <gtest/gtest.h>

#include <random>

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

backend::TensorMap case_inputs(const ir::OpCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> positive(0.1, 4.0);
  std::bernoulli_distribution coin(0.5);
  backend::TensorMap m;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const auto& in = c.inputs[i];
    Tensor t(ir::fill_dtype(in.fill), in.shape);
    const std::int64_t last = in.shape.empty() ? 1 : in.shape.back();
    for (std::int64_t j = 0; j < t.numel(); ++j) {
      switch (in.fill) {
        case ir::Fill::normal: t.data<float>()[j] = static_cast<float>(normal(rng)); break;
        case ir::Fill::positive: t.data<float>()[j] = static_cast<float>(positive(rng)); break;
        case ir::Fill::boolean: t.data<std::uint8_t>()[j] = coin(rng); break;
        case ir::Fill::keep_first: t.data<std::uint8_t>()[j] = j % last == 0 || coin(rng); break;
        case ir::Fill::ids: t.data<std::int32_t>()[j] = static_cast<std::int32_t>(rng() % 8) - 1; break;
      }
    }
    m.emplace("x" + std::to_string(i), std::move(t));
  }
  return m;
}

class Conformance : public ::testing::TestWithParam<Param> {};

TEST_P(Conformance, MatchesFloat64Reference) {
  const Param& p = GetParam();
  ir::Graph g = ir::case_graph(p.op, p.c);
  testing::expect_equivalent(g, case_inputs(p.c, 1234 + p.index), p.backend);
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
