// Cross-backend comparison against the float64 reference.
#include "backends/equivalence.hpp"

#include <algorithm>

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>

#include "backends/reference/reference_backend.hpp"
#include "ir/bind.hpp"

namespace qkv::backend {

namespace {
bool finite(double x) { return std::isfinite(x); }
/// Float formats by precision, narrowest first; others (i32, bool, f64) rank as f32's or above.
int precision_rank(DType d) { return d == DType::bf16 ? 0 : d == DType::f16 ? 1 : 2; }
}  // namespace

ComputedIn computed_in(const ir::Graph& g, const std::string& name) {
  // One pass in node order: each value's narrowest format among itself and what it depends on,
  // and the half results (inputs are exact) on its longest path.
  const auto out = static_cast<std::size_t>(g.output(name));
  std::vector<ComputedIn> at(out + 1);
  for (std::size_t i = 0; i <= out; ++i) {
    const ir::Node& n = g.nodes()[i];
    ComputedIn& r = at[i];
    for (ir::ValueId v : n.inputs) {
      const ComputedIn& from = at[static_cast<std::size_t>(v)];
      if (precision_rank(from.format) < precision_rank(r.format)) r.format = from.format;
      r.roundings = std::max(r.roundings, from.roundings);
    }
    if (precision_rank(n.dtype) < precision_rank(r.format)) r.format = n.dtype;
    r.roundings += is_half(n.dtype) && n.op != ir::Op::input;
  }
  return at[out];
}

OutputComparison compare_output(const std::string& name, const Tensor& actual, const Tensor& oracle, const Tensor& plain, double factor,
                                const Tensor* plain_reversed, ComputedIn how) {
  OutputComparison c;
  c.output = name;
  if (actual.shape() != oracle.shape()) {
    c.max_abs_error = std::numeric_limits<double>::infinity();
    return c;
  }
  double scale = 0, err32 = 0, err = 0;
  for (std::int64_t i = 0; i < oracle.numel(); ++i) {
    double o = oracle.at(i), a = actual.at(i), p = plain.at(i);
    if (finite(o)) scale = std::max(scale, std::fabs(o));
    auto diff = [&](double x) {
      if (!finite(o) || !finite(x)) return (std::isnan(o) && std::isnan(x)) || o == x ? 0.0 : std::numeric_limits<double>::infinity();
      return std::fabs(x - o);
    };
    err32 = std::max(err32, diff(p));
    if (plain_reversed && plain_reversed->shape() == oracle.shape()) err32 = std::max(err32, diff(plain_reversed->at(i)));
    err = std::max(err, diff(a));
  }
  // The floor: a few f32 ulps of the largest magnitude; for an output computed through f16 or
  // bf16 values, ulps of the narrowest format by the half roundings on its longest path (any f32
  // difference before a rounding can move its result to the neighbouring half value, and the
  // moves add up along the path).
  const DType format = precision_rank(actual.dtype()) < precision_rank(how.format) ? actual.dtype() : how.format;
  // Flips at independent roundings add as a random walk: three standard deviations of n of them.
  const double half_roundings = std::max(1.0, 3.0 * std::sqrt(static_cast<double>(how.roundings)));
  const double eps = format == DType::f16    ? std::ldexp(1.0, -10) * half_roundings
                     : format == DType::bf16 ? std::ldexp(1.0, -7) * half_roundings
                                             : 4 * static_cast<double>(std::numeric_limits<float>::epsilon());
  c.max_abs_error = err;
  c.max_rel_error = scale > 0 ? err / scale : err;
  c.budget = (finite(err32) ? factor * err32 : 0.0) + eps * std::max(scale, 1e-30) + how.spread;
  c.pass = err <= c.budget;
  return c;
}

std::map<std::string, double> half_rounding_spread(const ir::Graph& g, const TensorMap& inputs, const TensorMap& oracle) {
  std::map<std::string, double> spread;
  const bool rounds = std::any_of(g.nodes().begin(), g.nodes().end(), [](const ir::Node& n) {
    return (is_half(n.dtype) && n.op != ir::Op::input) || n.op == ir::Op::round_f16 || n.op == ir::Op::round_bf16;
  });
  if (!rounds) return spread;
  std::map<std::string, double> largest, magnitude;
  for (std::uint32_t seed = 1; seed <= 4; ++seed) {
    const TensorMap flipped =
        make_reference_backend({.precision = Precision::f64, .f64_outputs = true, .flipped_half_roundings = seed})->compile(g)->run(inputs);
    for (const auto& [name, o] : oracle) {
      const Tensor& t = flipped.at(name);
      for (std::int64_t i = 0; i < o.numel(); ++i)
        if (finite(o.at(i)) && finite(t.at(i))) {
          largest[name] = std::max(largest[name], std::fabs(t.at(i) - o.at(i)));
          magnitude[name] = std::max(magnitude[name], std::fabs(o.at(i)));
        }
    }
  }
  // At most a sixteenth of the output's magnitude: past a comparison (a mask, a where) flips move
  // an output by whole values, and an output whose budget were its own size could not fail.
  for (const auto& [name, o] : oracle) spread[name] = std::min(largest[name], magnitude[name] / 16);
  return spread;
}

bool EquivalenceReport::pass() const {
  for (const auto& b : backends)
    if (!b.pass) return false;
  return !backends.empty();
}

std::string EquivalenceReport::table() const {
  int w = 10;  // the output column fits the longest output name
  for (const auto& b : backends)
    for (const auto& o : b.outputs) w = std::max(w, static_cast<int>(o.output.size()));
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-10s %-*s %13s %13s %13s  %s\n", "backend", w, "output", "max abs err", "max rel err", "budget", "result");
  out += line;
  for (const auto& b : backends) {
    if (!b.error.empty()) {
      std::snprintf(line, sizeof line, "%-10s %-*s %13s %13s %13s  FAIL: ", b.backend.c_str(), w, "-", "-", "-", "-");
      out += line + b.error + "\n";
      continue;
    }
    for (const auto& o : b.outputs) {
      std::snprintf(line, sizeof line, "%-10s %-*s %13.3e %13.3e %13.3e  %s\n", b.backend.c_str(), w, o.output.substr(0, 200).c_str(),
                    o.max_abs_error, o.max_rel_error, o.budget, o.pass ? "pass" : "FAIL");
      out += line;
    }
  }
  return out;
}

EquivalenceReport check_equivalence(const ir::Graph& g, const TensorMap& inputs, const std::vector<std::string>& backends, double factor) {
  return check_equivalence(g, inputs, backends, factor, [](const std::string& name) { return create(name); });
}

EquivalenceReport check_equivalence(const ir::Graph& g, const TensorMap& inputs, const std::vector<std::string>& backends, double factor,
                                    const std::function<std::unique_ptr<Backend>(const std::string&)>& make) {
  TensorMap oracle = make_reference_backend({Precision::f64, true})->compile(g)->run(inputs);
  TensorMap plain = make_reference_backend({Precision::f32, true})->compile(g)->run(inputs);
  TensorMap reversed =
      make_reference_backend({.precision = Precision::f32, .f64_outputs = true, .f64_inputs = false, .reversed_sums = true})->compile(g)->run(inputs);
  std::optional<std::map<std::string, double>> spread;  // measured only for an output that needs it
  EquivalenceReport report;
  for (const auto& name : backends) {
    BackendReport b;
    b.backend = name;
    try {
      auto backend = make(name);
      b.device = backend->device();
      TensorMap got = backend->compile(g)->run(inputs);
      b.pass = true;
      for (const auto& [out, t] : oracle) {
        ComputedIn how = computed_in(g, out);
        OutputComparison c = compare_output(out, got.at(out), t, plain.at(out), factor, &reversed.at(out), how);
        if (!c.pass) {  // beyond the ulps of its own magnitude: what the half roundings can move it by joins the budget
          if (!spread) spread = half_rounding_spread(g, inputs, oracle);
          if (auto it = spread->find(out); it != spread->end()) how.spread = it->second;
          c = compare_output(out, got.at(out), t, plain.at(out), factor, &reversed.at(out), how);
        }
        b.pass &= c.pass;
        b.outputs.push_back(c);
      }
    } catch (const Error& e) {
      b.error = e.what();
      b.pass = false;
    }
    report.backends.push_back(std::move(b));
  }
  return report;
}

TensorMap random_inputs(const ir::Graph& g, const std::map<std::string, std::int64_t>& dims, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::bernoulli_distribution keep(0.7);
  TensorMap r;
  for (ir::ValueId v : g.inputs()) {
    const ir::Node& n = g.node(v);
    std::vector<std::int64_t> shape;
    for (int i = 0; i < n.shape.rank; ++i) {
      try {
        shape.push_back(ir::dim_size(g, n.shape[i], dims));
      } catch (const ShapeError& e) {
        throw ShapeError("input '" + n.name + "': " + e.what());
      }
    }
    Tensor t;
    try {
      t = Tensor(n.dtype, shape);
    } catch (const ResourceError& e) {
      throw ResourceError("input '" + n.name + "': " + e.what());
    } catch (const ShapeError& e) {
      throw ShapeError("input '" + n.name + "': " + e.what());
    }
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      switch (n.dtype) {
        case DType::f32: t.data<float>()[i] = static_cast<float>(normal(rng)); break;
        case DType::f64: t.data<double>()[i] = normal(rng); break;
        case DType::boolean: t.data<std::uint8_t>()[i] = keep(rng); break;
        case DType::i32: t.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng() % 8); break;
        case DType::f16: t.data<Half>()[i] = to_half(normal(rng)); break;
        case DType::bf16: t.data<BFloat16>()[i] = to_bfloat16(normal(rng)); break;
      }
    }
    r.emplace(n.name, std::move(t));
  }
  return r;
}

}  // namespace qkv::backend
