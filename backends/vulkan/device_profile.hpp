// One record of everything about a Vulkan device that decides which kernels qkv generates and
// whether the device may run them, and the two functions that read it: choose_kernels (every
// launch decision: geometry, subgroups, shared memory, cooperative matrices, 16-bit storage,
// fusion limits) and device_spirv (a kernel's SPIR-V as the device runs it, checked against what
// it was created with). A record comes from a real device (Context::profile) or from a GPU
// family's published limits (device_families), so the same choices are made, compiled and
// checked with or without the hardware: tests run every kernel under every family here.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/vulkan/features.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "codegen/fusion.hpp"
#include "codegen/glsl.hpp"
#include "codegen/spirv.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::backend::vulkan {

struct DeviceProfile {
  std::string name;                                     ///< the device's (or the family's) name
  bool cpu_device = false;                              ///< VK_PHYSICAL_DEVICE_TYPE_CPU (lavapipe)
  std::uint32_t subgroup_size = 0;                      ///< where compute shaders may use subgroups (ballot), else 0
  bool subgroup_arithmetic = false;                     ///< subgroupAdd, subgroupMax in compute shaders
  std::array<std::uint32_t, 3> cooperative_fragment{};  ///< f16 x f16 -> f32 fragment (M, N, K) enabled, all 0 for none
  bool cooperative_khr = false;                         ///< that fragment is VK_KHR_cooperative_matrix's (kernels translated from NV's)
  std::uint64_t storage_offset_alignment = 16;          ///< minStorageBufferOffsetAlignment
  std::uint32_t max_workgroup_count = 65535;            ///< maxComputeWorkGroupCount: the most workgroups along an axis (the least of the three)
  DeviceFeatures features;                              ///< what the device was created with, and its limits
};

/// What qkv generates for a device and the user's options.
struct KernelChoices {
  codegen::Target target;                                ///< the code generator's device record
  codegen::FusionLimits fusion;                          ///< storage buffers a fused kernel may bind
  ir::HalfInputs half_inputs = ir::HalfInputs::widened;  ///< whether f16/bf16 tensors stay 16-bit on the device
};

/// Every launch decision for `device` under `options`. Throws BackendError for an option the
/// device cannot honour (cooperative matrices required where it has none, a tuning geometry past
/// its limits).
KernelChoices choose_kernels(const DeviceProfile& device, const VulkanOptions& options);

/// Whether `device` runs node n's kernel rather than decomposing the node: the generator has one
/// and it binds no more storage buffers than the device allows per shader.
bool device_supports(const DeviceProfile& device, const ir::Node& n);

/// The SPIR-V `device` runs for kernel `k` with these specialization constants: compiled,
/// translated to VK_KHR_cooperative_matrix where that is the device's extension, and checked
/// against its features and limits (check_kernel: a BackendError naming the kernel and what is
/// missing). `needs`, when given, receives what the module asks of the device.
std::vector<std::uint32_t> device_spirv(const codegen::KernelSource& k, const DeviceProfile& device, codegen::SpirvOptimization optimization,
                                        const std::vector<std::uint32_t>& specialization = {}, codegen::SpirvNeeds* needs = nullptr);

/// The GPU families users run on, each as the record its devices report (from their published
/// limits: vulkan.gpuinfo.org): NVIDIA (subgroups of 32, 48 KiB shared memory, NV cooperative
/// matrices or none), AMD RDNA in wave32 and wave64 (64 KiB, KHR cooperative matrices), Intel Arc
/// (subgroups of 8, 16 and 32), Apple through MoltenVK (32 KiB), Qualcomm Adreno and Arm Mali
/// (small workgroups), a Vulkan 1.1 device at the specification's minimums (no subgroups, no
/// 16-bit storage, 16 KiB, 4 storage buffers a stage, 128 invocations), and lavapipe at
/// subgroups of 4, 8 and 16.
std::vector<DeviceProfile> device_families();

}  // namespace qkv::backend::vulkan
