// A kernel's SPIR-V needs against the features its device was created with: the rules of the
// Vulkan specification's "SPIR-V Environment" appendix (capabilities and extensions to features,
// the memory model's scopes, cooperative-matrix types, limits) that qkv's kernels can meet.
#include "backends/vulkan/features.hpp"

#include <spirv/unified1/spirv.hpp>

#include <algorithm>
#include <iterator>

#include "ir/error.hpp"

namespace qkv::backend::vulkan {

namespace {

using F = DeviceFeatures;
using Sub = vk::SubgroupFeatureFlagBits;

struct CapabilityRule {
  std::uint32_t capability;
  const char* feature;  // what the device must have been created with
  bool (*has)(const F&);
};

bool subgroup(const F& d, Sub op) { return static_cast<bool>(d.subgroup_operations & op); }

// Every capability a qkv kernel may declare; one not listed is an error (it cannot be checked).
const CapabilityRule kCapabilities[] = {
    {spv::CapabilityShader, "", [](const F&) { return true; }},
    {spv::CapabilityMatrix, "", [](const F&) { return true; }},
    {spv::CapabilityFloat16, "the shaderFloat16 feature (VK_KHR_shader_float16_int8)", [](const F& d) { return d.shader_float16; }},
    {spv::CapabilityInt16, "the shaderInt16 feature", [](const F& d) { return d.shader_int16; }},
    {spv::CapabilityInt64, "the shaderInt64 feature", [](const F& d) { return d.shader_int64; }},
    {spv::CapabilityFloat64, "the shaderFloat64 feature", [](const F& d) { return d.shader_float64; }},
    {spv::CapabilityStorageBuffer16BitAccess, "the storageBuffer16BitAccess feature", [](const F& d) { return d.storage_buffer_16bit; }},
    {spv::CapabilityGroupNonUniform, "basic subgroup operations in compute shaders", [](const F& d) { return subgroup(d, Sub::eBasic); }},
    {spv::CapabilityGroupNonUniformVote, "subgroup vote operations", [](const F& d) { return subgroup(d, Sub::eVote); }},
    {spv::CapabilityGroupNonUniformArithmetic, "subgroup arithmetic operations", [](const F& d) { return subgroup(d, Sub::eArithmetic); }},
    {spv::CapabilityGroupNonUniformBallot, "subgroup ballot operations", [](const F& d) { return subgroup(d, Sub::eBallot); }},
    {spv::CapabilityGroupNonUniformShuffle, "subgroup shuffle operations", [](const F& d) { return subgroup(d, Sub::eShuffle); }},
    {spv::CapabilityGroupNonUniformShuffleRelative, "subgroup relative shuffle operations",
     [](const F& d) { return subgroup(d, Sub::eShuffleRelative); }},
    {spv::CapabilityGroupNonUniformClustered, "subgroup clustered operations", [](const F& d) { return subgroup(d, Sub::eClustered); }},
    {spv::CapabilityGroupNonUniformQuad, "subgroup quad operations", [](const F& d) { return subgroup(d, Sub::eQuad); }},
    {spv::CapabilityVulkanMemoryModel, "the vulkanMemoryModel feature (VK_KHR_vulkan_memory_model)", [](const F& d) { return d.memory_model; }},
    {spv::CapabilityVulkanMemoryModelDeviceScope, "the vulkanMemoryModelDeviceScope feature", [](const F& d) { return d.memory_model_device_scope; }},
    {spv::CapabilityCooperativeMatrixNV, "VK_NV_cooperative_matrix", [](const F& d) { return d.extensions.count("VK_NV_cooperative_matrix") > 0; }},
    {6022, "VK_KHR_cooperative_matrix", [](const F& d) { return d.extensions.count("VK_KHR_cooperative_matrix") > 0; }},
};

struct ExtensionRule {
  const char* spirv;
  const char* device_extension;  // enables it below core_version
  std::uint32_t core_version;    // from which the core API has it (0: never)
};

const ExtensionRule kExtensions[] = {
    {"SPV_KHR_storage_buffer_storage_class", "VK_KHR_storage_buffer_storage_class", VK_API_VERSION_1_1},
    {"SPV_KHR_16bit_storage", "VK_KHR_16bit_storage", VK_API_VERSION_1_1},
    {"SPV_KHR_vulkan_memory_model", "VK_KHR_vulkan_memory_model", VK_API_VERSION_1_2},
    {"SPV_NV_cooperative_matrix", "VK_NV_cooperative_matrix", 0},
    {"SPV_KHR_cooperative_matrix", "VK_KHR_cooperative_matrix", 0},
};

std::string version_name(std::uint32_t v) { return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)); }

/// The Vulkan version a SPIR-V version needs (SPIR-V 1.3 with Vulkan 1.1, 1.5 with 1.2, 1.6 with 1.3).
std::uint32_t vulkan_for_spirv(std::uint32_t spirv) {
  const std::uint32_t minor = (spirv >> 8) & 0xffu;
  return minor <= 0 ? VK_API_VERSION_1_0 : minor <= 3 ? VK_API_VERSION_1_1 : minor <= 5 ? VK_API_VERSION_1_2 : VK_API_VERSION_1_3;
}

std::string product_name(const codegen::SpirvNeeds::Product& p) {
  using codegen::component_name;
  return std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) + " " + component_name(p.a) + " x " + component_name(p.b) +
         " + " + component_name(p.c) + " -> " + component_name(p.result) + " in a " + codegen::scope_name(p.scope);
}

bool offered(const codegen::SpirvNeeds::Product& p, const vk::CooperativeMatrixPropertiesNV& o) {
  return o.MSize == p.m && o.NSize == p.n && o.KSize == p.k && static_cast<std::uint32_t>(o.AType) == p.a &&
         static_cast<std::uint32_t>(o.BType) == p.b && static_cast<std::uint32_t>(o.CType) == p.c &&
         static_cast<std::uint32_t>(o.DType) == p.result && static_cast<std::uint32_t>(o.scope) == p.scope;
}

}  // namespace

std::string kernel_mismatch(const std::string& kernel, const codegen::SpirvNeeds& needs, const DeviceFeatures& d) {
  const std::string k = "kernel " + kernel + " needs ";
  if (vulkan_for_spirv(needs.version) > d.api_version)
    return k + "SPIR-V " + std::to_string((needs.version >> 16) & 0xffu) + "." + std::to_string((needs.version >> 8) & 0xffu) + " (Vulkan " +
           version_name(vulkan_for_spirv(needs.version)) + "), but the device runs Vulkan " + version_name(d.api_version);
  for (std::uint32_t c : needs.capabilities) {
    const auto* rule = std::find_if(std::begin(kCapabilities), std::end(kCapabilities), [&](const CapabilityRule& r) { return r.capability == c; });
    if (rule == std::end(kCapabilities))
      return k + "the SPIR-V capability " + codegen::capability_name(c) + ", which qkv does not know how to check against a device";
    if (!rule->has(d))
      return k + "the SPIR-V capability " + codegen::capability_name(c) + ", that is " + rule->feature + ", which the device was created without";
  }
  for (const std::string& e : needs.extensions) {
    const auto* rule = std::find_if(std::begin(kExtensions), std::end(kExtensions), [&](const ExtensionRule& r) { return e == r.spirv; });
    if (rule == std::end(kExtensions)) return k + "the SPIR-V extension " + e + ", which qkv does not know how to check against a device";
    if (!d.extensions.count(rule->device_extension) && !(rule->core_version && d.api_version >= rule->core_version))
      return k + "the SPIR-V extension " + e + ", that is " + rule->device_extension + ", which the device was created without";
  }
  if (needs.memory_model == spv::MemoryModelVulkan && !d.memory_model)
    return k + "the Vulkan memory model, that is the vulkanMemoryModel feature, which the device was created without";
  for (std::uint32_t s : needs.memory_scopes) {
    if (s == spv::ScopeDevice && d.memory_model && !d.memory_model_device_scope)
      return k +
             "Device memory scope (its atomics or barriers), which a device created with vulkanMemoryModel but without "
             "vulkanMemoryModelDeviceScope forbids (VUID-RuntimeSpirv-vulkanMemoryModel-06265)";
    if (s == spv::ScopeQueueFamily && !d.memory_model)
      return k + "QueueFamily memory scope, which needs the vulkanMemoryModel feature the device was created without";
    if (s != spv::ScopeDevice && s != spv::ScopeWorkgroup && s != spv::ScopeSubgroup && s != spv::ScopeInvocation && s != spv::ScopeQueueFamily)
      return k + codegen::scope_name(s) + " memory scope, which no Vulkan device offers";
  }
  for (std::uint32_t s : needs.execution_scopes)
    if (s != spv::ScopeWorkgroup && s != spv::ScopeSubgroup)
      return k + codegen::scope_name(s) + " execution scope, where a compute shader's barriers and group operations take Workgroup or Subgroup";
  for (const auto& p : needs.products)
    if (std::none_of(d.cooperative.begin(), d.cooperative.end(), [&](const auto& o) { return offered(p, o); }))
      return k + "the cooperative-matrix product " + product_name(p) + ", which the device does not list among its " +
             std::to_string(d.cooperative.size()) + " (" + (p.khr ? "VK_KHR" : "VK_NV") + "_cooperative_matrix)";
  const auto& w = needs.workgroup_size;
  for (int i = 0; i < 3; ++i)
    if (w[i] > d.max_workgroup_size[i])
      return k + std::to_string(w[i]) + " invocations along workgroup axis " + "xyz"[i] + ", more than the device's " +
             std::to_string(d.max_workgroup_size[i]) + " (maxComputeWorkGroupSize)";
  if (std::uint64_t{w[0]} * w[1] * w[2] > d.max_invocations)
    return k + std::to_string(std::uint64_t{w[0]} * w[1] * w[2]) + " invocations per workgroup, more than the device's " +
           std::to_string(d.max_invocations) + " (maxComputeWorkGroupInvocations)";
  if (needs.shared_bytes > d.max_shared_memory)
    return k + std::to_string(needs.shared_bytes) + " bytes of shared memory, more than the device's " + std::to_string(d.max_shared_memory) +
           " (maxComputeSharedMemorySize)";
  if (needs.storage_buffers > d.max_storage_buffers)
    return k + std::to_string(needs.storage_buffers) + " storage buffers, more than the device's " + std::to_string(d.max_storage_buffers) +
           " (maxPerStageDescriptorStorageBuffers)";
  if (needs.push_constant_bytes > d.max_push_constants)
    return k + std::to_string(needs.push_constant_bytes) + " bytes of push constants, more than the device's " +
           std::to_string(d.max_push_constants) + " (maxPushConstantsSize)";
  return "";
}

void check_kernel(const std::string& kernel, const codegen::SpirvNeeds& needs, const DeviceFeatures& device, const std::string& device_name) {
  if (std::string why = kernel_mismatch(kernel, needs, device); !why.empty()) throw BackendError("vulkan: " + why + " (" + device_name + ")");
}

}  // namespace qkv::backend::vulkan
