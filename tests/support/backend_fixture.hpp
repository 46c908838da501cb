// Helpers for tests that run graphs on every backend.
#pragma once

#include <ostream>

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "backends/backend.hpp"
#include "backends/equivalence.hpp"
#include "sweeps/op_cases.hpp"

namespace qkv::testing {

/// The backend, or nullptr after GTEST_SKIP-worthy reason in `why`. When the backend cannot
/// start and QKV_REQUIRE_VULKAN=1 (CI), the caller must fail instead of skipping.
std::shared_ptr<backend::Backend> backend_or_reason(const std::string& name, std::string& why);

/// Whether a missing Vulkan device fails tests (CI sets QKV_REQUIRE_VULKAN=1).
bool vulkan_required();

/// The vulkan backend in both launch geometries (lavapipe's rows per invocation, a GPU's one),
/// whichever device runs the test.
std::vector<std::unique_ptr<backend::Backend>> vulkan_tunings();

/// The folder scripts/fetch_models.sh unpacks all-MiniLM-L6-v2 into: $QKV_MODELS_DIR (default
/// ~/.cache/qkv/models)/all-MiniLM-L6-v2.
std::string minilm_dir();
/// Whether a missing real checkpoint fails tests (CI sets QKV_REQUIRE_MODELS=1).
bool models_required();

/// One of the registry's op cases: the op, the case's index among the op's cases, the case.
struct RegistryCase {
  ir::Op op;
  std::size_t index;
  ir::OpCase c;
};
/// Every case of every op for which `keep(op)` holds, in registry order.
std::vector<RegistryCase> registry_cases(bool (*keep)(ir::Op) = nullptr);
/// "matmul_3": a test-name part for a case.
std::string case_label(const RegistryCase& c);
/// How GoogleTest prints a case (instead of its bytes): "matmul_3 (transpose b)".
void PrintTo(const RegistryCase& c, std::ostream* os);

/// Inputs x0, x1, ... for one of the registry's op cases, filled as the case says: normal floats,
/// positive floats in [0.25, 4), booleans, keep-first masks, or i32 ids in [-1, 6] (some outside
/// one_hot's depth on purpose).
backend::TensorMap case_inputs(const ir::OpCase& c, std::uint64_t seed);

/// `inputs` with each f32 tensor rounded to `dtype` (for a graph from ir::to_dtype).
backend::TensorMap inputs_in_dtype(backend::TensorMap inputs, DType dtype);

/// max |actual - expected| / max |expected|: the normwise relative error. Adds a test failure
/// (and returns infinity) when the shapes differ.
double normwise_error(const Tensor& actual, const Tensor& expected);

/// A test parameterised by a backend's name is named after it ("All/Blocks.Forward/vulkan"), so
/// that --gtest_filter='*vulkan*' picks every Vulkan test (a GPU session's suite does).
struct BackendParamName {
  template <class P> std::string operator()(const ::testing::TestParamInfo<P>& info) const { return std::string(info.param); }
};

/// Runs `g` on `backend_name` with `inputs` and expects every output within budget against the
/// float64 reference. Skips (or fails, where required) when the backend cannot start.
void expect_equivalent(const ir::Graph& g, const backend::TensorMap& inputs, const std::string& backend_name);
/// The same on a backend made by the caller (e.g. vulkan with other options).
void expect_equivalent(const ir::Graph& g, const backend::TensorMap& inputs, backend::Backend& b);

}  // namespace qkv::testing

/// Gets a backend by name into `var`, or skips the test with the reason (fails in CI for Vulkan).
/// Declares `var`, all-MiniLM-L6-v2's folder, or skips the test (fails it where models are
/// required) when scripts/fetch_models.sh has not fetched it.
#define QKV_MINILM_OR_SKIP(var)                                                                         \
  const std::string var = ::qkv::testing::minilm_dir();                                                 \
  if (!std::filesystem::exists(var + "/model.safetensors")) {                                           \
    if (::qkv::testing::models_required()) FAIL() << var << " is missing: run scripts/fetch_models.sh"; \
    GTEST_SKIP() << var << " is missing: scripts/fetch_models.sh fetches it";                           \
  }

#define QKV_GET_BACKEND_OR_SKIP(var, name)                                                      \
  std::string var##_why;                                                                        \
  auto var = ::qkv::testing::backend_or_reason(name, var##_why);                                \
  if (!var) {                                                                                   \
    if (::qkv::testing::vulkan_required()) FAIL() << "backend " << (name) << ": " << var##_why; \
    GTEST_SKIP() << "backend " << (name) << " unavailable: " << var##_why;                      \
  }
