// Runs that report each output as soon as its value is final (what data-parallel training
// reduces gradients on while the backward still runs), with the same values as a plain run.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

/// `early` from the first kernel, `late` after a chain of kernels that overwrite their
/// intermediates in place, `held` an input passed through.
ir::Graph early_and_late() {
  ir::Graph g;
  ir::Dim n = g.symbol("N");
  auto x = g.add_input("x", DType::f32, {n});
  g.set_output("early", g.add(ir::Op::mul, {x, x}));
  ir::ValueId v = x;
  for (int i = 0; i < 6; ++i) v = g.add(ir::Op::tanh, {g.add(ir::Op::add, {v, x})});
  g.set_output("late", v);
  g.set_output("held", x);
  return g;
}

std::vector<std::byte> bytes(const Tensor& t) { return {t.raw(), t.raw() + t.nbytes()}; }

/// Records when each output arrives, counted in calls between kernels.
struct Recorder final : backend::RunObserver {
  int kernels = 0;
  std::map<std::string, int, std::less<>> at;
  backend::TensorMap values;
  void output_ready(std::string_view name, const Tensor& value) override {
    EXPECT_FALSE(at.contains(name)) << name << " reported twice";
    at.emplace(name, kernels);
    values.emplace(name, value);
  }
  void between_kernels() override { ++kernels; }
};

class RunObserver : public ::testing::TestWithParam<std::string> {};

TEST_P(RunObserver, ReportsEveryOutputOnceWithTheValuesRunReturns) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto exe = b->compile(early_and_late());
  const backend::TensorMap in = {{"x", Tensor::from<float>({4}, {0.5f, -1, 2, 0.25f})}};
  const backend::TensorMap plain = exe->run(in);
  for (int round = 0; round < 2; ++round) {  // the second reuses the plan
    Recorder r;
    const backend::TensorMap out = exe->run_observed(in, r);
    ASSERT_EQ(out.size(), 3u);
    ASSERT_EQ(r.values.size(), 3u);
    for (const auto& [name, t] : plain) {
      EXPECT_EQ(bytes(out.at(name)), bytes(t)) << name;
      EXPECT_EQ(bytes(r.values.at(name)), bytes(t)) << name;
    }
    if (GetParam() == "vulkan") {  // one submission: everything at its end
      EXPECT_EQ(r.kernels, 0);
    } else {  // kernel by kernel: `early` while the chain is still to run
      EXPECT_GE(r.kernels, 13);
      EXPECT_LE(r.at.at("early"), 2) << "reported after " << r.at.at("early") << " of " << r.kernels << " kernels";
      EXPECT_GE(r.at.at("late"), 12);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, RunObserver, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

}  // namespace
}  // namespace qkv
