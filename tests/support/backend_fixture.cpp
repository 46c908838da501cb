// Backend helpers for tests.
#include "tests/support/backend_fixture.hpp"

#include "sweeps/random_graph.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <random>

#include "backends/reference/reference_backend.hpp"
#include "backends/vulkan/vulkan_backend.hpp"

namespace qkv::testing {

bool vulkan_required() {
  const char* env = std::getenv("QKV_REQUIRE_VULKAN");
  return env && std::string(env) == "1";
}

std::vector<std::unique_ptr<backend::Backend>> vulkan_tunings() {
  std::vector<std::unique_ptr<backend::Backend>> tunings;
  for (auto t : {backend::VulkanOptions::Tuning::cpu, backend::VulkanOptions::Tuning::gpu}) {
    auto options = backend::vulkan_options_from_env();
    options.tuning = t;
    tunings.push_back(backend::make_vulkan_backend(options));
  }
  return tunings;
}

std::string minilm_dir() {
  const char* dir = std::getenv("QKV_MODELS_DIR");
  const char* home = std::getenv("HOME");
  return (dir ? std::string(dir) : std::string(home ? home : "/root") + "/.cache/qkv/models") + "/all-MiniLM-L6-v2";
}

bool models_required() {
  const char* env = std::getenv("QKV_REQUIRE_MODELS");
  return env && std::string(env) == "1";
}

std::shared_ptr<backend::Backend> backend_or_reason(const std::string& name, std::string& why) {
  static std::map<std::string, std::shared_ptr<backend::Backend>> cache;
  static std::map<std::string, std::string> failures;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  if (auto it = failures.find(name); it != failures.end()) {
    why = it->second;
    return nullptr;
  }
  try {
    return cache[name] = backend::create(name);
  } catch (const Error& e) {
    why = failures[name] = e.what();
    return nullptr;
  }
}

std::vector<RegistryCase> registry_cases(bool (*keep)(ir::Op)) {
  std::vector<RegistryCase> r;
  for (ir::Op op : ir::all_ops()) {
    if (keep && !keep(op)) continue;
    auto cases = ir::op_cases(op);
    for (std::size_t i = 0; i < cases.size(); ++i) r.push_back({op, i, cases[i]});
  }
  return r;
}

void PrintTo(const RegistryCase& c, std::ostream* os) { *os << case_label(c) << " (" << c.c.label << ")"; }

std::string case_label(const RegistryCase& c) { return std::string(ir::op_name(c.op)) + "_" + std::to_string(c.index); }

backend::TensorMap case_inputs(const ir::OpCase& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  backend::TensorMap m;
  for (std::size_t i = 0; i < c.inputs.size(); ++i)
    m.emplace("x" + std::to_string(i), backend::filled_tensor(c.inputs[i].fill, c.inputs[i].shape, rng));
  return m;
}

double normwise_error(const Tensor& actual, const Tensor& expected) {
  if (actual.shape() != expected.shape()) {
    ADD_FAILURE() << "shape " << actual.type_string() << ", expected " << expected.type_string();
    return std::numeric_limits<double>::infinity();
  }
  double err = 0, scale = 0;
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    err = std::max(err, std::abs(actual.at(i) - expected.at(i)));
    scale = std::max(scale, std::abs(expected.at(i)));
  }
  return scale > 0 ? err / scale : err;
}

backend::TensorMap inputs_in_dtype(backend::TensorMap inputs, DType dtype) {
  for (auto& [name, t] : inputs)
    if (t.dtype() == DType::f32) t = t.to(dtype);
  return inputs;
}

void expect_equivalent(const ir::Graph& g, const backend::TensorMap& inputs, const std::string& backend_name) {
  std::string why;
  auto b = backend_or_reason(backend_name, why);
  if (!b) {
    if (vulkan_required()) FAIL() << "backend " << backend_name << ": " << why;
    GTEST_SKIP() << "backend " << backend_name << " unavailable: " << why;
  }
  expect_equivalent(g, inputs, *b);
}

void expect_equivalent(const ir::Graph& g, const backend::TensorMap& inputs, backend::Backend& b) {
  const std::string backend_name = b.name();
  auto oracle = backend::make_reference_backend({backend::Precision::f64, true})->compile(g)->run(inputs);
  auto plain = backend::make_reference_backend({backend::Precision::f32, true})->compile(g)->run(inputs);
  std::optional<std::map<std::string, double>> spread;  // measured only for an output that needs it
  auto got = b.compile(g)->run(inputs);
  for (const auto& [name, t] : oracle) {
    ASSERT_TRUE(got.contains(name)) << "missing output " << name;
    ASSERT_EQ(got.at(name).shape(), t.shape()) << name;
    backend::ComputedIn how = backend::computed_in(g, name);
    auto c = backend::compare_output(name, got.at(name), t, plain.at(name), backend::kDefaultBudgetFactor, nullptr, how);
    if (!c.pass) {  // beyond the ulps of its own magnitude: what the half roundings can move it by joins the budget
      if (!spread) spread = backend::half_rounding_spread(g, inputs, oracle);
      if (auto it = spread->find(name); it != spread->end()) how.spread = it->second;
      c = backend::compare_output(name, got.at(name), t, plain.at(name), backend::kDefaultBudgetFactor, nullptr, how);
    }
    EXPECT_TRUE(c.pass) << backend_name << " output " << name << ": max abs error " << c.max_abs_error << " > budget " << c.budget;
  }
}

}  // namespace qkv::testing
