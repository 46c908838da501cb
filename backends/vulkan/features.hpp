// What a Vulkan device was created with, and the check of every kernel's SPIR-V against it before
// its pipeline is created: a module that declares a capability whose feature was not enabled,
// uses a scope the memory model forbids, multiplies a cooperative-matrix fragment the device does
// not list, or asks for more invocations or shared memory than the device's limits is an error
// naming the kernel and what is missing, on any device, with or without validation layers (which
// see only some of this, and only where they are new enough).
#pragma once

#include <vulkan/vulkan.hpp>

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "codegen/spirv_needs.hpp"

namespace qkv::backend::vulkan {

/// The device's features as they were enabled at vkCreateDevice (not merely offered), and the
/// limits a pipeline must keep.
struct DeviceFeatures {
  /// min(the instance's, the device's): the core version pipelines may rely on.
  std::uint32_t api_version = 0;
  std::set<std::string> extensions;                                         // enabled device extensions
  bool storage_buffer_16bit = false;                                        // storageBuffer16BitAccess
  bool shader_float16 = false;                                              // shaderFloat16 (VK_KHR_shader_float16_int8)
  bool shader_int16 = false, shader_int64 = false, shader_float64 = false;  // VkPhysicalDeviceFeatures
  bool memory_model = false, memory_model_device_scope = false;             // VkPhysicalDeviceVulkanMemoryModelFeatures
  /// Subgroup operations compute shaders may use (none before Vulkan 1.1 or outside compute).
  vk::SubgroupFeatureFlags subgroup_operations;
  /// The cooperative-matrix products the device lists for the enabled extension (NV's or KHR's),
  /// empty where neither is enabled.
  std::vector<vk::CooperativeMatrixPropertiesNV> cooperative;
  std::uint32_t max_shared_memory = 0, max_invocations = 0, max_push_constants = 0, max_storage_buffers = 0;
  std::array<std::uint32_t, 3> max_workgroup_size{};
  /// maxStorageBufferRange: the most bytes one storage-buffer binding may span (lavapipe: 128 MiB).
  std::uint64_t max_storage_range = 0;
};

/// Throws BackendError "vulkan: kernel NAME needs WHAT, which DEVICE ..." for the first need of
/// `needs` that `device` does not meet. What the module's reader could not evaluate
/// (needs.unknown) is left unchecked.
void check_kernel(const std::string& kernel, const codegen::SpirvNeeds& needs, const DeviceFeatures& device, const std::string& device_name);

/// What check_kernel would say, or "" where the kernel may run.
std::string kernel_mismatch(const std::string& kernel, const codegen::SpirvNeeds& needs, const DeviceFeatures& device);

}  // namespace qkv::backend::vulkan
