// Every kernel's SPIR-V is checked against the features its device was created with before its
// pipeline is created (vulkan::check_kernel): what a GPU's driver would reject or a current
// validation layer report is an error here first, naming the kernel and what the device lacks.
// The checks run against lavapipe's live context and against an NVIDIA-like device described by
// hand, with each feature withheld in turn.
#include <gtest/gtest.h>

#include <spirv/unified1/spirv.hpp>

#include <cstdlib>
#include <functional>

#include "backends/vulkan/context.hpp"
#include "backends/vulkan/features.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "codegen/attention_glsl.hpp"
#include "codegen/glsl.hpp"
#include "codegen/spirv.hpp"
#include "codegen/spirv_needs.hpp"
#include "codegen/storage_plan.hpp"
#include "ir/passes/passes.hpp"
#include "sweeps/op_cases.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

using backend::vulkan::DeviceFeatures;
using backend::vulkan::kernel_mismatch;
using Kernels = std::vector<std::pair<std::string, codegen::SpirvNeeds>>;

/// A device as NVIDIA's Vulkan driver describes a Hopper GPU: Vulkan 1.3, subgroups of 32 with
/// every operation, 48 KiB of shared memory for a compute shader, f16 and 16-bit storage, the
/// memory model with Device scope, VK_NV_cooperative_matrix with f16 x f16 + f32 fragments of
/// 16 x 16 x 16 and 16 x 8 x 16.
DeviceFeatures nvidia_like() {
  DeviceFeatures d;
  d.api_version = VK_API_VERSION_1_1;  // qkv's instance asks for 1.1
  d.extensions = {"VK_KHR_shader_float16_int8", "VK_NV_cooperative_matrix", "VK_KHR_vulkan_memory_model"};
  d.storage_buffer_16bit = d.shader_float16 = true;
  d.memory_model = d.memory_model_device_scope = true;
  using S = vk::SubgroupFeatureFlagBits;
  d.subgroup_operations = S::eBasic | S::eVote | S::eArithmetic | S::eBallot | S::eShuffle | S::eShuffleRelative | S::eClustered | S::eQuad;
  using C = vk::ComponentTypeNV;
  for (std::uint32_t n : {16u, 8u}) d.cooperative.emplace_back(16, n, 16, C::eFloat16, C::eFloat16, C::eFloat32, C::eFloat32, vk::ScopeNV::eSubgroup);
  d.max_shared_memory = 49152;
  d.max_invocations = 1024;
  d.max_push_constants = 256;
  d.max_storage_buffers = 1048576;
  d.max_workgroup_size = {1024, 1024, 64};
  return d;
}

/// Every cooperative kernel of f16 attention's forward and backward at head dims 64, 128 and 256
/// over 1000 queries and keys, as codegen makes them for a GPU with `fragment` and 48 KiB of
/// shared memory, with the specialization constants their launch gives (the sizes of their
/// shared tiles): what the backend would create pipelines of on such a GPU.
Kernels cooperative_attention_kernels(std::array<std::uint32_t, 3> fragment, bool khr) {
  codegen::Target t;
  t.cpu_device = false;
  t.shared_bytes = 49152;
  t.max_invocations = 1024;
  t.subgroup_size = 32;
  t.subgroup_reductions = true;
  t.cooperative_matrix = {fragment[0], fragment[1], fragment[2], false};
  Kernels kernels;
  for (std::int64_t d : {64, 128, 256})
    for (int variant = 0; variant < 3; ++variant) {  // plain, causal (its prologue's shared flag), a keep-mask (its tile ranges)
      ir::Graph g;
      const ir::ValueId q = g.add_input("q", DType::f16, {1, 8, 1000, d}), k = g.add_input("k", DType::f16, {1, 8, 1000, d});
      const ir::ValueId v = g.add_input("v", DType::f16, {1, 8, 1000, d});
      ir::Attrs a;
      a.scale = 0.125;
      a.causal = variant == 1;
      if (variant == 2) {
        const ir::ValueId keep = g.add_input("keep", DType::boolean, {1, 1, 1, 1000});
        g.set_output("out", g.add(ir::Op::masked_attention, {q, k, v, keep}, a));
      } else {
        g.set_output("out", g.add(ir::Op::attention, {q, k, v}, a));
      }
      g = ir::lower_for_backend(ir::build_backward(g, {"", {"q", "k", "v"}, {"out"}}), codegen::implements, ir::HalfInputs::kept);
      std::vector<ir::Shape> shapes;
      for (const ir::Node& n : g.nodes()) shapes.push_back(n.shape);
      for (std::size_t i = 0; i < g.size(); ++i) {
        if (!ir::is_fused_attention(g.nodes()[i].op)) continue;
        const codegen::KernelSource ks = codegen::kernel_source(g, codegen::plan_storage(g), static_cast<ir::ValueId>(i), t);
        const codegen::KernelLaunch launch = codegen::kernel_launch(g, codegen::plan_storage(g), static_cast<ir::ValueId>(i), shapes, t);
        const auto spec = codegen::detail::attention_spec_constants(g.nodes()[i]).named(launch);
        if (ks.name.find("_coop") == std::string::npos || spec.at("COOP") == 0) continue;  // the scalar path
        auto words = codegen::compile_spirv(ks.name, ks.glsl);
        if (khr) words = codegen::khr_cooperative_matrix(words);
        kernels.emplace_back(ks.name + " (head dim " + std::to_string(d) + ")", codegen::spirv_needs(words, launch.specialization));
      }
    }
  return kernels;
}

/// The mismatches of `kernels` on `device`, one message per kernel that fails.
std::vector<std::string> mismatches(const Kernels& kernels, const DeviceFeatures& device) {
  std::vector<std::string> r;
  for (const auto& [name, needs] : kernels)
    if (std::string why = kernel_mismatch(name, needs, device); !why.empty()) r.push_back(why);
  return r;
}

/// A feature withheld: how, and words the error must name.
struct Withheld {
  const char* what;
  std::function<void(DeviceFeatures&)> withhold;
  std::vector<std::string> named;
};

/// Each withheld feature fails at least one of `kernels` (each message naming its kernel and the
/// feature) and, with nothing withheld, none fails.
void expect_each_withheld_feature_named(const Kernels& kernels, const DeviceFeatures& device, const std::vector<Withheld>& cases) {
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(mismatches(kernels, device), std::vector<std::string>{});
  for (const auto& [name, needs] : kernels) EXPECT_TRUE(needs.unknown.empty()) << name << ": " << ::testing::PrintToString(needs.unknown);
  for (const Withheld& w : cases) {
    SCOPED_TRACE(w.what);
    DeviceFeatures sabotaged = device;
    w.withhold(sabotaged);
    int failing = 0;
    for (const auto& [name, needs] : kernels) {
      const std::string why = kernel_mismatch(name, needs, sabotaged);
      if (why.empty()) continue;
      ++failing;
      EXPECT_NE(why.find("kernel " + name + " needs"), std::string::npos) << why;
      for (const std::string& word : w.named) EXPECT_NE(why.find(word), std::string::npos) << why;
    }
    EXPECT_GT(failing, 0) << "no kernel noticed";
  }
}

TEST(VulkanFeatures, CooperativeKernelsMeetAnNvidiaDeviceAndNameWhatItLacks) {
  const Kernels nv = cooperative_attention_kernels({16, 16, 16}, false);
  EXPECT_GE(nv.size(), 33u);  // forward, lse, dq, dk, dv at 64 and 128, the forward at 256; plain, causal, masked
  for (const auto& [name, needs] : nv) {
    EXPECT_GT(needs.shared_bytes, 16384u) << name;
    // Fragments are loaded from and stored to shared tiles at 16-byte multiples of their bases,
    // which are 16-byte aligned wherever a compiler places them only if every shared variable's
    // size is a multiple of 16 bytes: NVIDIA's driver computed wrong causal and masked attention
    // while a 4-byte flag came first (the emulated kernels, loading scalars, were right).
    for (std::uint64_t bytes : needs.shared_variables) EXPECT_EQ(bytes % 16, 0u) << name << ": a shared variable of " << bytes << " bytes";
  }
  using C = vk::ComponentTypeNV;
  expect_each_withheld_feature_named(
      nv, nvidia_like(),
      {
          // Under the Vulkan memory model glslang gives the kernels' atomics QueueFamily scope.
          {"the memory model", [](DeviceFeatures& d) { d.memory_model = d.memory_model_device_scope = false; }, {"vulkanMemoryModel"}},
          {"the extension", [](DeviceFeatures& d) { d.extensions.erase("VK_NV_cooperative_matrix"); }, {"VK_NV_cooperative_matrix"}},
          {"the fragment",
           [](DeviceFeatures& d) { d.cooperative.erase(d.cooperative.begin()); },
           {"cooperative-matrix product 16x16x16 f16 x f16 + f32 -> f32 in a Subgroup"}},
          {"an f16 accumulator only",
           [](DeviceFeatures& d) {
             for (auto& o : d.cooperative) o.CType = o.DType = C::eFloat16;
           },
           {"does not list"}},
          {"f16 arithmetic", [](DeviceFeatures& d) { d.shader_float16 = false; }, {"Float16", "shaderFloat16"}},
          {"16-bit storage", [](DeviceFeatures& d) { d.storage_buffer_16bit = false; }, {"StorageBuffer16BitAccess", "storageBuffer16BitAccess"}},
          {"32 KiB of shared memory (the launch planned for 48)",
           [](DeviceFeatures& d) { d.max_shared_memory = 32768; },
           {"bytes of shared memory", "maxComputeSharedMemorySize"}},
      });
  // The KHR translation on a device offering VK_KHR_cooperative_matrix (AMD, Intel) instead.
  DeviceFeatures amd = nvidia_like();
  amd.extensions = {"VK_KHR_shader_float16_int8", "VK_KHR_cooperative_matrix", "VK_KHR_vulkan_memory_model"};
  const Kernels khr = cooperative_attention_kernels({16, 16, 16}, true);
  EXPECT_EQ(mismatches(khr, amd), std::vector<std::string>{});
  EXPECT_EQ(mismatches(khr, nvidia_like()).size(), khr.size());  // NV's extension only
  EXPECT_EQ(mismatches(nv, amd).size(), nv.size());
}

// QKV_VULKAN_OPTIMIZE_SPIRV: 1 or 0, anything else an error naming the variable (needs no device).
TEST(VulkanOptions, OptimizeSpirvIsReadFromTheEnvironment) {
  const char* was = std::getenv("QKV_VULKAN_OPTIMIZE_SPIRV");
  const std::string saved = was ? was : "";
  setenv("QKV_VULKAN_OPTIMIZE_SPIRV", "1", 1);
  EXPECT_TRUE(backend::vulkan_options_from_env().optimize_spirv);
  setenv("QKV_VULKAN_OPTIMIZE_SPIRV", "0", 1);
  EXPECT_FALSE(backend::vulkan_options_from_env().optimize_spirv);
  setenv("QKV_VULKAN_OPTIMIZE_SPIRV", "yes", 1);
  try {
    backend::vulkan_options_from_env();
    ADD_FAILURE() << "QKV_VULKAN_OPTIMIZE_SPIRV=yes was taken";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("QKV_VULKAN_OPTIMIZE_SPIRV is 'yes'"), std::string::npos) << e.what();
  }
  if (was) setenv("QKV_VULKAN_OPTIMIZE_SPIRV", saved.c_str(), 1);
  else unsetenv("QKV_VULKAN_OPTIMIZE_SPIRV");
}

/// The live context of the default vulkan backend after running graphs that take every kind of
/// kernel: elementwise and fused chains, reductions and softmax over subgroups, matmuls, flash
/// attention forward and backward, 16-bit buffers, and the cooperative kernels (the device's or
/// emulated).
std::shared_ptr<backend::vulkan::Context> context_after_every_kind_of_kernel() {
  auto options = backend::vulkan_options_from_env();
  auto vulkan = backend::make_vulkan_backend(options);
  ir::Graph g;
  const ir::Dim n = g.symbol("N");
  const ir::ValueId q = g.add_input("q", DType::f32, {2, n, 16}), k = g.add_input("k", DType::f32, {2, n, 16});
  const ir::ValueId v = g.add_input("v", DType::f32, {2, n, 16});
  ir::Attrs attention;
  attention.scale = 0.25;
  const ir::ValueId o = g.add(ir::Op::attention, {q, k, v}, attention);
  ir::Attrs rows;
  rows.axis = 2;
  ir::Attrs tb;
  tb.transpose_b = true;
  g.set_output("o", o);
  g.set_output("s", g.add(ir::Op::softmax, {g.add(ir::Op::tanh, {g.add(ir::Op::matmul, {q, k}, tb)})}, rows));
  const ir::Graph grad = ir::build_backward(g, {"", {"q", "k", "v"}, {"o", "s"}});
  const ir::Graph half = ir::to_dtype(grad, DType::f16);
  for (const ir::Graph* graph : {&grad, &half}) vulkan->compile(*graph)->run(backend::random_inputs(*graph, {{"N", 40}}, 3));
  // The other geometry: reductions and softmax over subgroups (subgroupAdd, subgroupMax).
  auto gpu = options;
  gpu.tuning = backend::VulkanOptions::Tuning::gpu;
  backend::make_vulkan_backend(gpu)->compile(grad)->run(backend::random_inputs(grad, {{"N", 40}}, 3));
  using C = backend::VulkanOptions::CooperativeMatrix;
  if (options.cooperative_matrix == C::automatic) {
    options.cooperative_matrix = C::emulated;
    try {
      backend::make_vulkan_backend(options)->compile(half)->run(backend::random_inputs(half, {{"N", 40}}, 3));
    } catch (const BackendError&) {  // no f16 arithmetic to emulate them
    }
  }
  return backend::vulkan::Context::get(backend::vulkan_options_from_env());
}

TEST(VulkanFeatures, EveryPipelineIsCheckedAndAWithheldFeatureNamesTheKernel) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto ctx = context_after_every_kind_of_kernel();
  const DeviceFeatures& device = ctx->features();
  const Kernels kernels = ctx->kernel_needs();
  // Every kernel's module was read whole and met the device: the check ran before each pipeline.
  EXPECT_GE(kernels.size(), 8u);
  std::vector<Withheld> cases = {
      {"Vulkan 1.0", [](DeviceFeatures& d) { d.api_version = VK_API_VERSION_1_0; }, {"SPIR-V 1.3 (Vulkan 1.1)"}},
      {"subgroups", [](DeviceFeatures& d) { d.subgroup_operations = {}; }, {"GroupNonUniform", "subgroup operations"}},
      {"64 invocations", [](DeviceFeatures& d) { d.max_invocations = 64; }, {"invocations per workgroup", "maxComputeWorkGroupInvocations"}},
      {"a narrow workgroup",
       [](DeviceFeatures& d) {
         d.max_workgroup_size = {32, 1, 1};
       },
       {"invocations along workgroup axis x", "maxComputeWorkGroupSize"}},
      {"4 KiB of shared memory", [](DeviceFeatures& d) { d.max_shared_memory = 4096; }, {"maxComputeSharedMemorySize"}},
      {"64 bytes of push constants", [](DeviceFeatures& d) { d.max_push_constants = 64; }, {"bytes of push constants", "maxPushConstantsSize"}},
      {"two storage buffers", [](DeviceFeatures& d) { d.max_storage_buffers = 2; }, {"storage buffers", "maxPerStageDescriptorStorageBuffers"}},
  };
  if (device.storage_buffer_16bit)
    cases.push_back({"16-bit storage", [](DeviceFeatures& d) { d.storage_buffer_16bit = false; }, {"storageBuffer16BitAccess"}});
  if (device.shader_float16) cases.push_back({"f16 arithmetic", [](DeviceFeatures& d) { d.shader_float16 = false; }, {"shaderFloat16"}});
  if (device.subgroup_operations & vk::SubgroupFeatureFlagBits::eArithmetic)
    cases.push_back({"subgroup arithmetic",
                     [](DeviceFeatures& d) { d.subgroup_operations &= ~vk::SubgroupFeatureFlags(vk::SubgroupFeatureFlagBits::eArithmetic); },
                     {"subgroup arithmetic"}});
  if (device.memory_model)
    cases.push_back({"Device scope", [](DeviceFeatures& d) { d.memory_model_device_scope = false; }, {"VUID-RuntimeSpirv-vulkanMemoryModel-06265"}});
  expect_each_withheld_feature_named(kernels, device, cases);
}

TEST(VulkanFeatures, TheMemoryModelIsEnabledWithItsDeviceScopeOrNotAtAll) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const DeviceFeatures& d = backend::vulkan::Context::get(backend::vulkan_options_from_env())->features();
  EXPECT_EQ(d.memory_model, d.memory_model_device_scope);
  EXPECT_EQ(d.memory_model, d.extensions.count("VK_KHR_vulkan_memory_model") == 1);
  // Where the device offers both (lavapipe does), every kernel runs under the model the
  // cooperative kernels need, as on a GPU.
  int found = 0;
  for (const auto& info : backend::vulkan_devices())
    if (vulkan->device().starts_with(info.name + " (")) {
      ++found;
      EXPECT_EQ(d.memory_model, info.memory_model_device_scope) << info.name;
    }
  EXPECT_EQ(found, 1) << vulkan->device();
  // Cooperative matrices only with it.
  if (!d.cooperative.empty()) {
    EXPECT_TRUE(d.memory_model_device_scope);
  }
}

// A kernel binds each tensor whole: one larger than maxStorageBufferRange (lavapipe: 128 MiB; GPT-2
// small's f32 embedding is 154 MB) is named in a ResourceError when planned, not left to a
// validation error or a wrong result.
TEST(VulkanFeatures, ATensorBeyondTheStorageBufferRangeIsNamed) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const std::uint64_t limit = backend::vulkan::Context::get(backend::vulkan_options_from_env())->features().max_storage_range;
  if (limit > (std::uint64_t{1} << 30)) GTEST_SKIP() << "the device binds " << limit << " bytes at once: more than this test allocates";
  ir::Graph g;
  const ir::ValueId x = g.add_input("x", DType::f32, {g.symbol("N")});
  g.set_output("y", g.add(ir::Op::mul, {x, x}));
  auto exe = vulkan->compile(g);
  const auto fits = static_cast<std::int64_t>(limit / 4);
  EXPECT_EQ(exe->run({{"x", Tensor::from<float>({3}, {1, 2, 3})}}).at("y").at(2), 9.0);
  try {
    exe->run({{"x", Tensor(DType::f32, {fits + 1})}});
    FAIL() << "a tensor of " << (fits + 1) * 4 << " bytes was bound";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("vulkan: input 'x' f32[" + std::to_string(fits + 1) + "] is " + std::to_string((fits + 1) * 4) +
                                         " bytes, more than one storage buffer binding may span"),
              std::string::npos)
        << e.what();
  }
  // What fits still runs after it: the shape planned before the error (whose plan the failed
  // one released), and a new one.
  EXPECT_EQ(exe->run({{"x", Tensor::from<float>({3}, {1, 2, 3})}}).at("y").at(2), 9.0);
  EXPECT_EQ(exe->run({{"x", Tensor::from<float>({2}, {4, 5})}}).at("y").at(1), 25.0);
}

// ctest runs the subgroup-dependent tests again at lavapipe's sizes 4 and 16 (vulkan.subgroup_N.*):
// this says they did not silently run at the default size.
TEST(VulkanFeatures, TheSubgroupSizeIsTheOneTheRunAsksFor) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const char* expected = std::getenv("QKV_EXPECT_SUBGROUP_SIZE");
  if (!expected) GTEST_SKIP() << "QKV_EXPECT_SUBGROUP_SIZE is not set";
  EXPECT_EQ(std::to_string(backend::vulkan::Context::get(backend::vulkan_options_from_env())->subgroup_size()), expected) << vulkan->device();
}

}  // namespace
}  // namespace qkv
