// The vulkan flash kernels decide block sparsity with interval arithmetic written in GLSL
// (codegen's interval_helpers), the cpu with ir::bound_region in C++. Two copies of one set of
// rules: this test runs every GLSL rule on the device over intervals with infinities, zeros,
// signs and NaN flags, and checks each result against the C++ rule for the same op.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/vulkan/context.hpp"
#include "codegen/glsl_detail.hpp"
#include "ir/region.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

using ir::Op;
using ir::ValueRange;

struct Rule {
  Op op;
  int arity;
  const char* glsl;  // the call, of a, b, c
};

// Where's condition w is a boolean range: 0, 1 or both, maybe NaN.
const Rule kRules[] = {
    {Op::neg, 1, "iv_neg(a)"},           {Op::exp, 1, "iv_exp(a)"},
    {Op::log, 1, "iv_log(a)"},           {Op::sqrt, 1, "iv_sqrt(a)"},
    {Op::tanh, 1, "iv_tanh(a)"},         {Op::erf, 1, "iv_erf(a)"},
    {Op::sin, 1, "iv_periodic(a)"},      {Op::add, 2, "iv_add(a, b)"},
    {Op::sub, 2, "iv_sub(a, b)"},        {Op::mul, 2, "iv_mul(a, b)"},
    {Op::div, 2, "iv_div(a, b)"},        {Op::max, 2, "iv_max(a, b)"},
    {Op::equal, 2, "iv_equal(a, b)"},    {Op::greater, 2, "iv_greater(a, b)"},
    {Op::where, 3, "iv_where(w, b, c)"},
};
constexpr std::size_t kRuleCount = sizeof kRules / sizeof kRules[0];

/// The C++ rule: a region applying `rule.op` to its tensors t0, t1, t2, bounded from a, b, c.
ValueRange cpp_rule(const Rule& rule, const ValueRange& a, const ValueRange& b, const ValueRange& c) {
  const std::vector<DType> dtypes = {rule.op == Op::where ? DType::boolean : DType::f32, DType::f32, DType::f32};
  ir::Graph r = ir::make_region(dtypes);
  std::vector<ir::ValueId> args;
  for (int i = 0; i < rule.arity; ++i) args.push_back(ir::kRegionFixedInputs + i);
  r.set_output("mod", r.add(rule.op, args));
  const ValueRange in[] = {ValueRange::unknown(), ValueRange::unknown(), ValueRange::unknown(), a, b, c};
  return ir::bound_region(r, in);
}

/// The GLSL rules over `cases` of four intervals (12 floats each: lo, hi, nan for a, b, c, w):
/// 3 floats (lo, hi, nan) per case and rule.
std::vector<float> glsl_rules(backend::vulkan::Context& ctx, const std::vector<float>& cases) {
  const std::size_t count = cases.size() / 12;
  // The helpers of every monotone unary op (generated from the registry's rows): a region that
  // uses them all.
  ir::Graph uses = ir::make_region({});
  ir::ValueId x = ir::kRegionScore;
  for (Op op : ir::all_ops())
    if (ir::op_info(op).category == ir::OpCategory::unary && op != Op::cast && ir::unary_monotone(op) != ir::Monotone::periodic)
      x = uses.add(op, {x});
  uses.set_output("mod", x);
  std::string glsl =
      "#version 450\nlayout(local_size_x = 64) in;\n"
      "layout(std430, binding = 0) readonly buffer BIn { float X[]; };\n"
      "layout(std430, binding = 1) writeonly buffer BOut { float Y[]; };\n" +
      codegen::detail::math_helpers(uses, true) + codegen::detail::interval_helpers(&uses) +
      "Iv load(uint at) { return Iv(X[at], X[at + 1u], X[at + 2u] != 0.0); }\n"
      "void store(uint at, Iv r) { Y[at] = r.lo; Y[at + 1u] = r.hi; Y[at + 2u] = r.nan ? 1.0 : 0.0; }\n"
      "void main() {\n"
      "  uint i = gl_GlobalInvocationID.x;\n";
  glsl += "  if (i >= " + std::to_string(count) + "u) return;\n";
  glsl += "  Iv a = load(12u * i), b = load(12u * i + 3u), c = load(12u * i + 6u), w = load(12u * i + 9u);\n";
  for (std::size_t k = 0; k < kRuleCount; ++k)
    glsl += "  store(3u * (i * " + std::to_string(kRuleCount) + "u + " + std::to_string(k) + "u), " + kRules[k].glsl + ");\n";
  glsl += "}\n";
  const auto& pipeline = ctx.pipeline({"interval_rules", glsl, 2});

  using U = vk::BufferUsageFlagBits;
  const auto in_bytes = cases.size() * sizeof(float), out_bytes = count * kRuleCount * 3 * sizeof(float);
  auto in = ctx.make_buffer(in_bytes, U::eStorageBuffer, true);
  auto out = ctx.make_buffer(out_bytes, U::eStorageBuffer, true);
  std::memcpy(in.mapped, cases.data(), in_bytes);
  const auto& dev = ctx.device();
  vk::DescriptorPoolSize size(vk::DescriptorType::eStorageBuffer, 2);
  vk::raii::DescriptorPool pool(dev, vk::DescriptorPoolCreateInfo(vk::DescriptorPoolCreateFlagBits::eFreeDescriptorSet, 1, size));
  vk::DescriptorSetLayout layout = *pipeline.set_layout;
  vk::raii::DescriptorSets sets(dev, vk::DescriptorSetAllocateInfo(*pool, layout));
  const vk::DescriptorBufferInfo infos[] = {{*in.buffer, 0, in_bytes}, {*out.buffer, 0, out_bytes}};
  std::vector<vk::WriteDescriptorSet> writes;
  for (std::uint32_t b = 0; b < 2; ++b) writes.emplace_back(*sets[0], b, 0, 1, vk::DescriptorType::eStorageBuffer, nullptr, &infos[b]);
  dev.updateDescriptorSets(writes, {});
  ctx.submit_and_wait([&](const vk::raii::CommandBuffer& cb) {
    cb.bindPipeline(vk::PipelineBindPoint::eCompute, *pipeline.pipeline);
    cb.bindDescriptorSets(vk::PipelineBindPoint::eCompute, *pipeline.layout, 0, *sets[0], {});
    cb.dispatch(static_cast<std::uint32_t>((count + 63) / 64), 1, 1);
    cb.pipelineBarrier(vk::PipelineStageFlagBits::eComputeShader, vk::PipelineStageFlagBits::eHost, {},
                       vk::MemoryBarrier(vk::AccessFlagBits::eShaderWrite, vk::AccessFlagBits::eHostRead), {}, {});
  });
  const auto* y = static_cast<const float*>(out.mapped);
  return {y, y + count * kRuleCount * 3};
}

/// Ends agree: the same infinity, or within `tolerance` relative (GLSL's transcendental
/// functions are approximations; the arithmetic is float rounding of the C++ rule's double).
bool same_end(double cpp, float glsl, double tolerance) {
  if (std::isinf(cpp)) return static_cast<double>(glsl) == cpp;
  return std::abs(static_cast<double>(glsl) - cpp) <= tolerance * std::max(1.0, std::abs(cpp));
}

TEST(VulkanIntervals, EveryGlslRuleAgreesWithBoundRegion) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto ctx = backend::vulkan::Context::get(backend::vulkan_options_from_env());
  const double inf = HUGE_VAL;
  const double ends[] = {-inf, -7.5, -2, -1, -0.25, 0, 0.5, 1, 3, 40, inf};
  std::mt19937 rng(7);
  auto pick = [&] { return ends[rng() % std::size(ends)]; };
  auto range = [&] {
    double lo = pick(), hi = pick();
    if (lo > hi) std::swap(lo, hi);
    return ValueRange{lo, hi, rng() % 4 == 0};
  };
  std::vector<std::array<ValueRange, 4>> triples;
  for (int i = 0; i < 2000; ++i) {
    const double w_lo = static_cast<double>(rng() % 2), w_hi = std::max(w_lo, static_cast<double>(rng() % 2));
    std::array<ValueRange, 4> t{range(), range(), range(), ValueRange{w_lo, w_hi, rng() % 4 == 0}};
    if (i % 5 == 0) t[1] = ValueRange::exactly(pick() == inf ? 2.0 : static_cast<double>(i % 7) - 3);  // a constant
    triples.push_back(t);
  }
  std::vector<float> cases;
  for (const auto& t : triples)
    for (const ValueRange& r : t) cases.insert(cases.end(), {static_cast<float>(r.lo), static_cast<float>(r.hi), r.nan ? 1.0f : 0.0f});
  const std::vector<float> y = glsl_rules(*ctx, cases);
  int checked = 0;
  for (std::size_t i = 0; i < triples.size(); ++i) {
    for (std::size_t k = 0; k < kRuleCount; ++k) {
      const Rule& rule = kRules[k];
      const ValueRange& a = rule.op == Op::where ? triples[i][3] : triples[i][0];
      const ValueRange want = cpp_rule(rule, a, triples[i][1], triples[i][2]);
      const float* got = y.data() + 3 * (i * kRuleCount + k);
      const double tolerance = rule.arity == 1 && rule.op != Op::neg ? 2e-6 : 1e-7;
      ASSERT_TRUE(same_end(want.lo, got[0], tolerance) && same_end(want.hi, got[1], tolerance) && want.nan == (got[2] != 0.0f))
          << ir::op_name(rule.op) << " of [" << a.lo << ", " << a.hi << (a.nan ? ", nan]" : "]") << ", [" << triples[i][1].lo << ", "
          << triples[i][1].hi << (triples[i][1].nan ? ", nan]" : "]") << ", [" << triples[i][2].lo << ", " << triples[i][2].hi
          << (triples[i][2].nan ? ", nan]" : "]") << ": C++ [" << want.lo << ", " << want.hi << (want.nan ? ", nan]" : "]") << ", GLSL [" << got[0]
          << ", " << got[1] << (got[2] != 0.0f ? ", nan]" : "]");
      ++checked;
    }
  }
  EXPECT_GT(checked, 20000);
}

}  // namespace
}  // namespace qkv
