// Finite-difference gradient checks.
#include "tests/support/gradcheck.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/equivalence.hpp"
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

backend::TensorMap expect_jvp_matches_central_differences(const ir::Graph& g, const backend::TensorMap& inputs, const std::vector<std::string>& wrt,
                                                          std::uint64_t seed) {
  auto reference = backend::make_reference_backend({backend::Precision::f64, true, true});
  const ir::Graph jvp = ir::build_jvp(g, {wrt, {}});
  backend::TensorMap in64;
  for (const auto& [name, t] : inputs) in64.emplace(name, t.dtype() == DType::f32 ? t.to(DType::f64) : t);
  // A random direction: each tangent of its input's shape, uniform in [-1, 1).
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  backend::TensorMap with_tangents = in64;
  for (const auto& x : wrt) {
    Tensor t(DType::f64, in64.at(x).shape());
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = uniform(rng);
    with_tangents.insert_or_assign("t_" + x, std::move(t));
  }
  const backend::TensorMap analytic = reference->compile(jvp)->run(with_tangents);
  // x + s h t for every x in wrt at once.
  auto forward = reference->compile(g);
  auto moved = [&](double s) {
    backend::TensorMap m = in64;
    for (const auto& x : wrt) {
      Tensor& v = m.at(x);
      const Tensor& t = with_tangents.at("t_" + x);
      for (std::int64_t i = 0; i < v.numel(); ++i) v.data<double>()[i] += s * t.data<double>()[i];
    }
    return forward->run(m);
  };
  const double h = 1e-6;
  const backend::TensorMap up = moved(h), down = moved(-h);
  int outputs = 0;
  for (const auto& [name, v] : g.outputs()) {
    if (!is_float(g.node(v).dtype)) continue;
    ++outputs;
    const Tensor& a = analytic.at("t_" + name);
    const Tensor &u = up.at(name), &d = down.at(name);
    EXPECT_EQ(a.shape(), u.shape()) << "t_" << name;
    if (a.shape() != u.shape()) continue;
    for (std::int64_t i = 0; i < a.numel(); ++i) {
      const double fd = (u.at(i) - d.at(i)) / (2 * h);
      if (std::isnan(fd) && std::isnan(a.at(i))) continue;
      EXPECT_NEAR(a.at(i), fd, 1e-5 * std::max(1.0, std::fabs(fd))) << "t_" << name << "[" << i << "]";
    }
  }
  EXPECT_GT(outputs, 0) << "no float output";
  return with_tangents;
}

}  // namespace qkv::testing
