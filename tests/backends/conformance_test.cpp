// Every op in the registry, every case it lists, on every backend, against the float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backends/reference/reference_backend.hpp"
#include "ir/passes/passes.hpp"
#include "sweeps/op_cases.hpp"
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

// The same case with every float value in f16, then bf16: each op computes in f32 (the
// reference in double) and rounds its result once; budgets are measured as for f32, with a floor
// of one ulp of the half format. On vulkan each case runs in one of the two, alternating with the
// case's index (an op with two cases or more meets both): its kernels are the f32 ones with the
// roundings, and lavapipe's compiles of a second dtype would add minutes to every CI run.
TEST_P(Conformance, MatchesFloat64ReferenceInF16AndBf16) {
  const Param& p = GetParam();
  const ir::Graph g = ir::case_graph(p.rc.op, p.rc.c);
  for (DType dtype : {DType::f16, DType::bf16}) {
    if (p.backend == "vulkan" && (dtype == DType::f16) != (p.rc.index % 2 == 0)) continue;
    SCOPED_TRACE(dtype_name(dtype));
    const ir::Graph h = ir::to_dtype(g, dtype);
    testing::expect_equivalent(h, testing::inputs_in_dtype(testing::case_inputs(p.rc.c, 1234 + p.rc.index), dtype), p.backend);
  }
}

// NaN and infinities propagate as the float64 reference defines, on every backend (ggml's
// test-backend-ops checks the same): each float input gets a NaN, a +inf and a -inf, and every
// output element must be NaN where the reference's is, the same infinity where the reference's
// is one, and finite (and close) where the reference's is finite.
TEST_P(Conformance, NanAndInfPropagateAsTheReference) {
  const Param& p = GetParam();
  ir::Graph g = ir::case_graph(p.rc.op, p.rc.c);
  backend::TensorMap inputs = testing::case_inputs(p.rc.c, 99 + p.rc.index);
  bool injected = false;
  for (auto& [name, t] : inputs) {
    if (t.dtype() != DType::f32 || t.numel() < 3) continue;
    float* x = t.data<float>();
    const std::int64_t n = t.numel();
    x[0] = std::numeric_limits<float>::quiet_NaN();
    x[n / 2] = std::numeric_limits<float>::infinity();
    x[n - 1] = -std::numeric_limits<float>::infinity();
    injected = true;
  }
  if (!injected) GTEST_SKIP() << "no float input of three or more elements";
  QKV_GET_BACKEND_OR_SKIP(b, p.backend);
  auto oracle = backend::make_reference_backend({backend::Precision::f64, true})->compile(g)->run(inputs);
  auto got = b->compile(g)->run(inputs);
  for (const auto& [name, want] : oracle) {
    const Tensor& have = got.at(name);
    int reported = 0;
    for (std::int64_t i = 0; i < want.numel() && reported < 5; ++i) {
      const double w = want.at(i), h = have.at(i);
      const bool same = std::isnan(w) ? std::isnan(h) : std::isinf(w) ? h == w : std::isfinite(h) && std::abs(h - w) <= 1e-3 * (1.0 + std::abs(w));
      if (!same) {
        ++reported;
        ADD_FAILURE() << p.backend << " output " << name << "[" << i << "] = " << h << ", reference " << w;
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) { return testing::case_label(info.param.rc) + "_" + info.param.backend; }

INSTANTIATE_TEST_SUITE_P(AllOps, Conformance, ::testing::ValuesIn(all_params()), param_name);

TEST(Conformance, EveryOpHasCases) {
  for (ir::Op op : ir::all_ops()) EXPECT_FALSE(ir::op_cases(op).empty()) << ir::op_name(op) << " has no test cases";
}

}  // namespace
}  // namespace qkv
