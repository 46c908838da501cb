// Finite-difference gradient checks.
#include "tests/support/gradcheck.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "backends/reference/reference_backend.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::testing {

ir::Graph with_weighted_sum_loss(const ir::Graph& g) {
  ir::Graph out = ir::rebuild(g);
  ir::ValueId total = -1;
  for (const auto& [name, v] : g.outputs()) {
    ir::ValueId o = out.output(name);
    if (out.node(o).dtype != DType::f32) continue;
    ir::ValueId w = out.add_input("w_" + name, DType::f32, out.node(o).shape);
    ir::ValueId s = out.add(ir::Op::mul, {o, w});
    ir::Attrs first;
    first.keepdim = false;
    while (out.node(s).shape.rank > 0) s = out.add(ir::Op::reduce_sum, {s}, first);
    total = total < 0 ? s : out.add(ir::Op::add, {total, s});
  }
  out.set_output("loss", total);
  return out;
}

void expect_gradients_match_finite_differences(const ir::Graph& g, const backend::TensorMap& inputs, const std::vector<std::string>& wrt,
                                               int probes) {
  auto reference = backend::make_reference_backend({backend::Precision::f64, true, true});
  backend::TensorMap in64;
  for (const auto& [name, t] : inputs) in64.emplace(name, t.dtype() == DType::f32 ? t.to(DType::f64) : t);
  auto backward = reference->compile(ir::build_backward(g, {"loss", wrt, {}}));
  auto forward = reference->compile(g);
  backend::TensorMap analytic = backward->run(in64);
  for (const auto& name : wrt) {
    const Tensor& grad = analytic.at("d_" + name);
    Tensor& x = in64.at(name);
    ASSERT_EQ(grad.shape(), x.shape()) << name;
    const std::int64_t n = x.numel();
    const std::int64_t step = std::max<std::int64_t>(1, n / probes);
    for (std::int64_t i = 0; i < n; i += step) {
      double& xi = x.data<double>()[i];
      const double saved = xi, h = 1e-6 * std::max(1.0, std::fabs(saved));
      xi = saved + h;
      double up = forward->run(in64).at("loss").at(0);
      xi = saved - h;
      double down = forward->run(in64).at("loss").at(0);
      xi = saved;
      double fd = (up - down) / (2 * h), a = grad.at(i);
      EXPECT_NEAR(a, fd, 1e-5 * std::max(1.0, std::fabs(fd))) << "d loss / d " << name << "[" << i << "]";
    }
  }
}

}  // namespace qkv::testing
