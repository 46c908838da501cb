// Every kernel qkv generates, under the limits of each GPU family users have: the same choices the
// vulkan backend makes on such a device (vulkan::choose_kernels from its DeviceProfile), each
// kernel compiled, translated where the family has KHR cooperative matrices, validated by
// SPIRV-Tools for its Vulkan version, and checked as a pipeline would be (invocations, shared
// memory, storage buffers, push constants, capabilities, subgroup operations, cooperative-matrix
// products) with its launch's specialization constants and workgroup counts. No device needed:
// a GPU family's kernels are proven here before anyone runs them there.
#include <gtest/gtest.h>

#include <spirv-tools/libspirv.hpp>

#include <algorithm>
#include <cctype>

#include "backends/equivalence.hpp"
#include "backends/vulkan/device_profile.hpp"
#include "codegen/fusion.hpp"
#include "codegen/spirv_needs.hpp"
#include "codegen/storage_plan.hpp"
#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "models/models.hpp"

namespace qkv {
namespace {

using backend::vulkan::DeviceProfile;

struct Model {
  std::string name;
  std::map<std::string, std::string> set;
  std::map<std::string, std::int64_t> dims;
  DType dtype = DType::f32;
  bool backward = false;
  bool jvp = false;  // forward mode: the outputs' tangents along every float input
};

/// The models whose kernels differ by device: flash attention at head dims 64 and 128 (forward,
/// log-sum-exp, the three gradients and the tangent, causal and flex), matmuls with fused
/// epilogues, softmax and reductions, in f32 and f16 (cooperative matrices, 16-bit storage).
std::vector<Model> models() {
  const std::map<std::string, std::int64_t> long_rows = {{"B", 2}, {"N", 200}, {"M", 200}, {"D", 64}, {"Dv", 64}};
  std::map<std::string, std::int64_t> wide = long_rows;
  wide["D"] = wide["Dv"] = 128;
  return {
      {"sdpa", {{"weights", "false"}, {"causal", "true"}}, long_rows},
      {"sdpa", {{"weights", "false"}, {"causal", "true"}}, long_rows, DType::f16},
      {"sdpa", {{"weights", "false"}}, wide},
      {"sdpa", {{"weights", "false"}}, wide, DType::f16},
      {"sdpa", {{"weights", "false"}, {"softcap", "30"}}, long_rows},
      {"sdpa", {{"weights", "false"}, {"causal", "true"}}, long_rows, DType::f32, true},
      {"sdpa", {{"weights", "false"}}, wide, DType::f32, true},
      {"sdpa", {{"weights", "false"}, {"causal", "true"}}, long_rows, DType::f32, false, true},
      {"sdpa", {{"weights", "false"}, {"softcap", "30"}}, wide, DType::f16, false, true},
      {"mha", {}, {{"B", 2}, {"N", 40}, {"M", 40}}},
      {"gqa", {}, {{"B", 2}, {"N", 70}}, DType::f16},
      {"decoder-block", {}, {{"B", 2}, {"T", 48}}},
      {"decoder-block", {}, {{"B", 2}, {"T", 48}}, DType::f16},
      {"decoder-block", {}, {{"B", 2}, {"T", 48}}, DType::f32, true},
  };
}

ir::Graph build(const Model& m) {
  const models::ModelSpec& spec = models::find_model(m.name);
  std::map<std::string, std::int64_t> dims = m.dims;
  for (const auto& [name, size] : spec.dims) dims.try_emplace(name, size);
  ir::Graph g = spec.build(models::resolve_options(spec, m.set), dims);
  if (m.dtype != DType::f32) g = ir::to_dtype(g, m.dtype);
  if (!m.backward && !m.jvp) return g;
  std::vector<std::string> wrt, seeds;
  for (ir::ValueId v : g.inputs())
    if (is_float(g.node(v).dtype)) wrt.push_back(g.node(v).name);
  if (m.jvp) return ir::build_jvp(g, {wrt, {}});
  for (const auto& [name, v] : g.outputs())
    if (is_float(g.node(v).dtype)) seeds.push_back(name);
  return ir::build_backward(g, {"", wrt, seeds});
}

spv_target_env environment(std::uint32_t spirv_version) {
  const std::uint32_t minor = (spirv_version >> 8) & 0xffu;
  return minor <= 3 ? SPV_ENV_VULKAN_1_1 : minor <= 4 ? SPV_ENV_VULKAN_1_1_SPIRV_1_4 : minor <= 5 ? SPV_ENV_VULKAN_1_2 : SPV_ENV_VULKAN_1_3;
}

class DeviceFamily : public ::testing::TestWithParam<DeviceProfile> {};

TEST_P(DeviceFamily, EveryKernelCompilesValidatesAndFits) {
  const DeviceProfile& device = GetParam();
  const backend::vulkan::KernelChoices choices = backend::vulkan::choose_kernels(device, backend::VulkanOptions{});
  std::size_t kernels = 0, cooperative = 0;
  for (const Model& m : models()) {
    const std::string what = m.name + (m.backward ? " backward" : m.jvp ? " forward mode" : "") + " in " + std::string(dtype_name(m.dtype));
    SCOPED_TRACE(what);
    const ir::Graph lowered = ir::lower_for_backend(
        build(m), [&](const ir::Node& n) { return backend::vulkan::device_supports(device, n); }, choices.half_inputs);
    for (const ir::Node& n : lowered.nodes()) ASSERT_FALSE(codegen::unsupported_reason(lowered, n)) << *codegen::unsupported_reason(lowered, n);
    std::map<std::string, std::int64_t> dims = m.dims;
    for (const auto& [name, size] : models::find_model(m.name).dims) dims.try_emplace(name, size);
    const backend::TensorMap inputs = backend::random_inputs(lowered, dims, 1);
    const std::vector<ir::Shape> shapes = ir::bind_shapes(lowered, inputs);
    const ir::StoragePlan storage = codegen::plan_storage(lowered, choices.target.view_alignment, choices.target.storage_buffers);
    for (const codegen::KernelGroup& group : codegen::plan_kernels(lowered, storage, choices.fusion)) {
      const codegen::KernelSource source = group.fused() ? codegen::fused_source(lowered, storage, group, choices.target)
                                                         : codegen::kernel_source(lowered, storage, group.root, choices.target);
      const codegen::KernelLaunch launch = group.fused() ? codegen::fused_launch(lowered, storage, group, shapes, choices.target)
                                                         : codegen::kernel_launch(lowered, storage, group.root, shapes, choices.target);
      SCOPED_TRACE("kernel " + source.name);
      codegen::SpirvNeeds needs;
      std::vector<std::uint32_t> spirv;
      try {
        spirv = backend::vulkan::device_spirv(source, device, codegen::SpirvOptimization::none, launch.specialization, &needs);
      } catch (const Error& e) {
        ADD_FAILURE() << e.what();
        continue;
      }
      EXPECT_TRUE(needs.unknown.empty()) << needs.unknown.front();
      // Debian 12's SPIRV-Tools predates SPV_KHR_cooperative_matrix: a module translated to it is
      // validated as the NV module it was translated from (the translation has tests of its own).
      if (std::any_of(needs.products.begin(), needs.products.end(), [](const auto& p) { return p.khr; }))
        spirv = codegen::compile_spirv(source.name, source.glsl, codegen::SpirvOptimization::none);
      std::string messages;
      spvtools::SpirvTools tools(environment(needs.version));
      tools.SetMessageConsumer(
          [&](spv_message_level_t, const char*, const spv_position_t&, const char* text) { messages += std::string(text) + "\n"; });
      EXPECT_TRUE(tools.Validate(spirv)) << messages;
      for (int axis = 0; axis < 3; ++axis) {
        EXPECT_GE(launch.groups[axis], 1u);
        EXPECT_LE(launch.groups[axis], device.max_workgroup_count) << "axis " << axis;
      }
      EXPECT_LE(launch.push.size() * 4, device.features.max_push_constants);
      ++kernels;
      cooperative += !needs.products.empty();
    }
  }
  EXPECT_GT(kernels, 60u);
  // Every family with cooperative matrices runs some kernels on them (f16 matmuls, attention).
  if (device.cooperative_fragment[0] != 0) EXPECT_GT(cooperative, 0u);
  else EXPECT_EQ(cooperative, 0u);
}

std::string test_name(const ::testing::TestParamInfo<DeviceProfile>& info) {
  std::string name;
  for (char c : info.param.name) {
    if (std::isalnum(static_cast<unsigned char>(c))) name += c;
    else if (!name.empty() && name.back() != '_') name += '_';
    if (name.size() >= 48) break;
  }
  while (!name.empty() && name.back() == '_') name.pop_back();
  return name + "_" + std::to_string(info.index);
}

INSTANTIATE_TEST_SUITE_P(Families, DeviceFamily, ::testing::ValuesIn(backend::vulkan::device_families()), test_name);

TEST(DeviceFamilies, KernelsChosenForAnotherDeviceAreRefusedByName) {
  // lavapipe's choices on a device with a quarter of its shared memory and 64 invocations: the
  // flash kernels' tiles and the reductions' workgroups no longer fit, and device_spirv says so.
  const std::vector<DeviceProfile> families = backend::vulkan::device_families();
  const DeviceProfile lavapipe = *std::find_if(families.begin(), families.end(), [](const DeviceProfile& d) { return d.cpu_device; });
  const backend::vulkan::KernelChoices choices = backend::vulkan::choose_kernels(lavapipe, backend::VulkanOptions{});
  DeviceProfile smaller = lavapipe;
  smaller.name = "a smaller device";
  smaller.features.max_shared_memory = lavapipe.features.max_shared_memory / 4;
  smaller.features.max_invocations = 64;
  const Model m{"sdpa", {{"weights", "false"}}, {{"B", 1}, {"N", 256}, {"M", 256}, {"D", 128}, {"Dv", 128}}};
  const ir::Graph lowered = ir::lower_for_backend(build(m), backend::vulkan_supports, choices.half_inputs);
  const backend::TensorMap inputs = backend::random_inputs(lowered, m.dims, 1);
  const std::vector<ir::Shape> shapes = ir::bind_shapes(lowered, inputs);
  int refused = 0;
  const ir::StoragePlan storage = codegen::plan_storage(lowered, choices.target.view_alignment, choices.target.storage_buffers);
  for (const codegen::KernelGroup& group : codegen::plan_kernels(lowered, storage, choices.fusion)) {
    if (group.fused()) continue;
    const codegen::KernelSource source = codegen::kernel_source(lowered, storage, group.root, choices.target);
    const codegen::KernelLaunch launch = codegen::kernel_launch(lowered, storage, group.root, shapes, choices.target);
    EXPECT_NO_THROW(backend::vulkan::device_spirv(source, lavapipe, codegen::SpirvOptimization::none, launch.specialization));
    try {
      backend::vulkan::device_spirv(source, smaller, codegen::SpirvOptimization::none, launch.specialization);
    } catch (const BackendError& e) {
      ++refused;
      EXPECT_NE(std::string(e.what()).find("kernel " + source.name + " needs "), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(refused, 0);
}

TEST(DeviceFamilies, CoverTheLimitsUsersHave) {
  // Subgroups of 0 (none), 4, 8, 16, 32 and 64; shared memory from 16 to 64 KiB; NV and KHR
  // cooperative matrices; devices without 16-bit storage or the Vulkan memory model.
  std::set<std::uint32_t> subgroups, shared;
  bool nv = false, khr = false, no16 = false, no_model = false, small = false;
  for (const DeviceProfile& d : backend::vulkan::device_families()) {
    subgroups.insert(d.subgroup_size);
    shared.insert(d.features.max_shared_memory / 1024);
    nv |= d.cooperative_fragment[0] != 0 && !d.cooperative_khr;
    khr |= d.cooperative_khr;
    no16 |= !d.features.storage_buffer_16bit;
    no_model |= !d.features.memory_model;
    small |= d.features.max_invocations <= 384 && d.features.max_storage_buffers == 4;
  }
  EXPECT_EQ(subgroups, (std::set<std::uint32_t>{0, 4, 8, 16, 32, 64}));
  EXPECT_EQ(shared, (std::set<std::uint32_t>{16, 32, 48, 64}));
  EXPECT_TRUE(nv && khr && no16 && no_model && small);
}

}  // namespace
}  // namespace qkv
