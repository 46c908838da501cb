#include "backends/vulkan/device_profile.hpp"

#include <algorithm>

#include "codegen/spirv_needs.hpp"
#include "ir/error.hpp"

namespace qkv::backend::vulkan {

namespace {

std::string fragment_text(const std::array<std::uint32_t, 3>& f) {
  return std::to_string(f[0]) + " x " + std::to_string(f[1]) + " x " + std::to_string(f[2]);
}

/// The cooperative matrices: the device's fragment, the emulated kernels' on request, or none.
codegen::Target::CooperativeMatrix cooperative_choice(const DeviceProfile& d, const VulkanOptions& o) {
  using C = VulkanOptions::CooperativeMatrix;
  const auto& fragment = d.cooperative_fragment;
  const std::string products =
      "f16 x f16 products accumulated in f32 in a subgroup (and the Vulkan memory model with its "
      "vulkanMemoryModelDeviceScope feature)";
  if (o.cooperative_matrix == C::on && fragment[0] == 0)
    throw BackendError("vulkan: cooperative matrices required (QKV_VULKAN_COOPERATIVE_MATRIX=1) but " + d.name +
                       " has no VK_NV_cooperative_matrix or VK_KHR_cooperative_matrix with " + products);
  if (o.cooperative_matrix == C::khr && (fragment[0] == 0 || !d.cooperative_khr))
    throw BackendError("vulkan: VK_KHR_cooperative_matrix required (QKV_VULKAN_COOPERATIVE_MATRIX=khr) but " + d.name + " has none with " + products);
  if (o.cooperative_matrix == C::emulated) {
    if (!d.features.shader_float16 || !d.features.storage_buffer_16bit || d.subgroup_size == 0)
      throw BackendError(
          "vulkan: the emulated cooperative-matrix kernel (QKV_VULKAN_COOPERATIVE_MATRIX=emulate) needs f16 arithmetic, 16-bit "
          "storage and subgroups, which " +
          d.name + " lacks");
    const auto& f = o.emulated_fragment;
    if (f[0] == 0 || f[1] == 0 || f[2] == 0 || f[0] * f[1] % d.subgroup_size != 0)
      throw BackendError("vulkan: an emulated fragment of " + fragment_text(f) + " does not split over subgroups of " +
                         std::to_string(d.subgroup_size));
    return {f[0], f[1], f[2], true};
  }
  if (o.cooperative_matrix != C::off && fragment[0] != 0) return {fragment[0], fragment[1], fragment[2], false};
  return {};
}

}  // namespace

KernelChoices choose_kernels(const DeviceProfile& d, const VulkanOptions& o) {
  KernelChoices c;
  codegen::Target& t = c.target;
  t.cpu_device = o.tuning == VulkanOptions::Tuning::automatic ? d.cpu_device : o.tuning == VulkanOptions::Tuning::cpu;
  t.shared_bytes = d.features.max_shared_memory;
  t.max_invocations = d.features.max_invocations;
  // The elementwise, layout, reduction and softmax kernels' workgroups: 256 invocations, or the
  // largest power of two the device allows (128 on a device at the specification's minimum).
  const std::uint32_t allowed = std::min({d.features.max_invocations, d.features.max_workgroup_size[0], 256u});
  t.invocations = 1;
  while (t.invocations * 2 <= allowed) t.invocations *= 2;
  t.subgroup_size = d.subgroup_size;
  t.subgroup_reductions = o.subgroup_reductions && d.subgroup_arithmetic;
  if (o.attention_invocations > d.features.max_invocations)
    throw BackendError("vulkan: " + std::to_string(o.attention_invocations) + " invocations per workgroup exceed the device's " +
                       std::to_string(d.features.max_invocations));
  t.attention_invocations = o.attention_invocations;
  t.attention_rows = o.attention_rows;
  t.attention_tile = o.attention_tile;
  t.split_kv = o.split_kv;
  t.deterministic = o.deterministic;
  t.cooperative_matrix = cooperative_choice(d, o);
  if (o.matmul_geometry[0] != 0) {
    const auto& m = o.matmul_geometry;
    t.matmul = {m[0], m[1], m[2], m[3], m[4]};
    const std::string why = t.matmul.invalid(t.shared_bytes, t.max_invocations);
    if (!why.empty())
      throw BackendError("vulkan: the matmul geometry " + std::to_string(m[0]) + "," + std::to_string(m[1]) + "," + std::to_string(m[2]) + "," +
                         std::to_string(m[3]) + "," + std::to_string(m[4]) + " is invalid: " + why);
  }
  // Some drivers report UINT32_MAX storage buffers; a fused kernel binds at most the default.
  c.fusion.storage_buffers = static_cast<int>(std::min(d.features.max_storage_buffers, static_cast<std::uint32_t>(c.fusion.storage_buffers)));
  t.view_alignment = static_cast<std::int64_t>(std::max<std::uint64_t>(d.storage_offset_alignment, 16));
  t.storage_buffers = d.features.max_storage_buffers;
  c.half_inputs = o.half_storage && d.features.storage_buffer_16bit ? ir::HalfInputs::kept : ir::HalfInputs::widened;
  return c;
}

bool device_supports(const DeviceProfile& d, const ir::Node& n) {
  return codegen::implements(n) && static_cast<std::uint32_t>(codegen::storage_buffers(n)) <= d.features.max_storage_buffers;
}

std::vector<std::uint32_t> device_spirv(const codegen::KernelSource& k, const DeviceProfile& d, codegen::SpirvOptimization optimization,
                                        const std::vector<std::uint32_t>& specialization, codegen::SpirvNeeds* needs_out) {
  std::vector<std::uint32_t> spirv = codegen::compile_spirv(k.name, k.glsl, optimization);
  if (d.cooperative_khr && codegen::uses_nv_cooperative_matrix(spirv)) spirv = codegen::khr_cooperative_matrix(spirv);
  // What a driver would reject, or a layer report, named here first on any device.
  codegen::SpirvNeeds needs = codegen::spirv_needs(spirv, specialization);
  check_kernel(k.name, needs, d.features, d.name);
  if (needs_out) *needs_out = std::move(needs);
  return spirv;
}

namespace {

using Sub = vk::SubgroupFeatureFlagBits;

/// A GPU as most report it: Vulkan 1.1 pipelines, 16-bit storage and f16 arithmetic, the Vulkan
/// memory model with Device scope, every subgroup operation, 1024 invocations.
DeviceProfile gpu(std::string name, std::uint32_t subgroup, std::uint32_t shared_kib) {
  DeviceProfile d;
  d.name = std::move(name);
  d.subgroup_size = subgroup;
  d.subgroup_arithmetic = subgroup > 0;
  DeviceFeatures& f = d.features;
  f.api_version = VK_API_VERSION_1_1;
  f.storage_buffer_16bit = f.shader_float16 = true;
  f.extensions = {"VK_KHR_shader_float16_int8", "VK_KHR_vulkan_memory_model"};
  f.memory_model = f.memory_model_device_scope = true;
  if (subgroup > 0)
    f.subgroup_operations =
        Sub::eBasic | Sub::eVote | Sub::eArithmetic | Sub::eBallot | Sub::eShuffle | Sub::eShuffleRelative | Sub::eClustered | Sub::eQuad;
  f.max_shared_memory = shared_kib * 1024;
  f.max_invocations = 1024;
  f.max_workgroup_size = {1024, 1024, 64};
  f.max_push_constants = 128;
  f.max_storage_buffers = 1u << 20;
  f.max_storage_range = std::uint64_t{1} << 32;
  d.storage_offset_alignment = 16;
  return d;
}

/// f16 x f16 + f32 -> f32 fragments in a subgroup, as the extension lists them.
DeviceProfile with_cooperative(DeviceProfile d, std::array<std::uint32_t, 3> fragment, bool khr) {
  d.cooperative_fragment = fragment;
  d.cooperative_khr = khr;
  d.features.extensions.insert(khr ? "VK_KHR_cooperative_matrix" : "VK_NV_cooperative_matrix");
  using T = vk::ComponentTypeNV;
  d.features.cooperative.emplace_back(fragment[0], fragment[1], fragment[2], T::eFloat16, T::eFloat16, T::eFloat32, T::eFloat32,
                                      vk::ScopeNV::eSubgroup);
  d.features.cooperative.emplace_back(fragment[0], fragment[1], fragment[2], T::eFloat16, T::eFloat16, T::eFloat16, T::eFloat16,
                                      vk::ScopeNV::eSubgroup);
  return d;
}

}  // namespace

std::vector<DeviceProfile> device_families() {
  std::vector<DeviceProfile> all;
  // NVIDIA (Turing and later): warps of 32, 48 KiB of shared memory without opting in, tensor
  // cores through VK_NV_cooperative_matrix (m16 n8 k16), or through KHR's, or not at all.
  DeviceProfile nvidia = gpu("NVIDIA (subgroup 32, 48 KiB)", 32, 48);
  nvidia.storage_offset_alignment = 16;
  nvidia.features.max_push_constants = 256;
  all.push_back(with_cooperative(nvidia, {16, 8, 16}, false));
  all.back().name = "NVIDIA with VK_NV_cooperative_matrix 16x8x16";
  all.push_back(with_cooperative(nvidia, {16, 16, 16}, true));
  all.back().name = "NVIDIA with VK_KHR_cooperative_matrix 16x16x16";
  all.push_back(nvidia);
  // AMD RDNA: 64 KiB of LDS, waves of 32 (RDNA3's cooperative matrices, 16x16x16 through KHR)
  // or 64 (what compute shaders get by default on RDNA1 and 2, and GCN).
  DeviceProfile wave32 = gpu("AMD RDNA3 wave32 with VK_KHR_cooperative_matrix 16x16x16", 32, 64);
  wave32.storage_offset_alignment = 4;
  wave32.features.max_storage_buffers = 8388606;
  all.push_back(with_cooperative(wave32, {16, 16, 16}, true));
  DeviceProfile wave64 = wave32;
  wave64.name = "AMD RDNA wave64";
  wave64.subgroup_size = 64;
  all.push_back(wave64);
  // Intel Arc: subgroups of 8, 16 or 32 (the compiler picks; a driver reports one), 64 KiB,
  // XMX through KHR's 8x16x16 at subgroups of 16, 64-byte storage offsets.
  for (std::uint32_t sg : {8u, 16u, 32u}) {
    DeviceProfile intel = gpu("Intel Arc (subgroup " + std::to_string(sg) + ")", sg, 64);
    intel.storage_offset_alignment = 64;
    intel.features.max_storage_buffers = 200;
    all.push_back(sg == 16 ? with_cooperative(intel, {8, 16, 16}, true) : intel);
    if (sg == 16) all.back().name = "Intel Arc (subgroup 16) with VK_KHR_cooperative_matrix 8x16x16";
  }
  // Apple silicon through MoltenVK: 32 KiB of threadgroup memory, 31 buffers per stage, no
  // Vulkan memory model.
  DeviceProfile apple = gpu("Apple M-series through MoltenVK (32 KiB, 31 buffers, no memory model)", 32, 32);
  apple.features.memory_model = apple.features.memory_model_device_scope = false;
  apple.features.extensions.erase("VK_KHR_vulkan_memory_model");
  apple.features.max_storage_buffers = 31;
  apple.features.max_push_constants = 4096;
  all.push_back(apple);
  // Qualcomm Adreno 6xx: waves of 64, 32 KiB, 24 storage buffers per stage, 64-byte offsets.
  DeviceProfile adreno = gpu("Qualcomm Adreno 6xx (subgroup 64, 32 KiB, 24 buffers)", 64, 32);
  adreno.features.max_storage_buffers = 24;
  adreno.storage_offset_alignment = 64;
  all.push_back(adreno);
  // Arm Mali (Bifrost, G52): warps of 8, 32 KiB, 384 invocations a workgroup.
  DeviceProfile mali = gpu("Arm Mali-G52 (subgroup 8, 32 KiB, 384 invocations)", 8, 32);
  mali.features.max_invocations = 384;
  mali.features.max_workgroup_size = {384, 384, 384};
  mali.features.max_storage_buffers = 36;
  mali.features.memory_model = mali.features.memory_model_device_scope = false;
  mali.features.extensions.erase("VK_KHR_vulkan_memory_model");
  all.push_back(mali);
  // The least a Vulkan 1.1 device may offer (the specification's required limits): no subgroup
  // operations in compute, no 16-bit storage or f16 arithmetic, 16 KiB of shared memory, 128
  // invocations a workgroup, 4 storage buffers a stage (kernels binding more are decomposed), 128
  // bytes of push constants, 2^27-byte buffers, 256-byte storage offsets.
  DeviceProfile least = gpu("a small Vulkan 1.1 GPU (no subgroups, no 16-bit storage, 16 KiB, 128 invocations, 4 buffers)", 0, 16);
  least.features.storage_buffer_16bit = least.features.shader_float16 = false;
  least.features.memory_model = least.features.memory_model_device_scope = false;
  least.features.extensions.clear();
  least.features.max_invocations = 128;
  least.features.max_workgroup_size = {128, 128, 64};
  least.features.max_storage_buffers = 4;
  least.features.max_storage_range = std::uint64_t{1} << 27;
  least.storage_offset_alignment = 256;
  all.push_back(least);
  // lavapipe (Mesa's CPU device) at each subgroup size LP_NATIVE_VECTOR_WIDTH gives it.
  for (std::uint32_t sg : {4u, 8u, 16u}) {
    DeviceProfile lavapipe = gpu("lavapipe (subgroup " + std::to_string(sg) + ")", sg, 32);
    lavapipe.cpu_device = true;
    lavapipe.features.max_storage_buffers = 32;
    all.push_back(lavapipe);
  }
  return all;
}

}  // namespace qkv::backend::vulkan
