// The Vulkan context shared by a backend and its executables: instance, device, queue, and the
// pipelines of every kernel compiled so far.
#pragma once

#include <vulkan/vulkan_raii.hpp>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backends/vulkan/device_profile.hpp"
#include "backends/vulkan/features.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "codegen/glsl.hpp"
#include "codegen/spirv.hpp"

namespace qkv::backend::vulkan {

/// A compiled kernel: its descriptor layout, pipeline layout and pipeline.
struct Pipeline {
  std::string kernel;
  codegen::SpirvNeeds needs;  // what its SPIR-V asked of the device (checked before creation)
  vk::raii::DescriptorSetLayout set_layout{nullptr};
  vk::raii::PipelineLayout layout{nullptr};
  vk::raii::Pipeline pipeline{nullptr};
  int buffers = 0;
};

/// A buffer with its memory, mapped when host-visible.
struct Buffer {
  vk::raii::Buffer buffer{nullptr};
  vk::raii::DeviceMemory memory{nullptr};
  void* mapped = nullptr;
  vk::DeviceSize size = 0;
};

class Context {
 public:
  /// The process-wide context for these options, created on first use.
  static std::shared_ptr<Context> get(const VulkanOptions& options);
  explicit Context(const VulkanOptions& options);

  const vk::raii::Device& device() const { return device_; }
  const vk::raii::Queue& queue() const { return queue_; }
  const vk::raii::CommandPool& command_pool() const { return pool_; }
  const vk::PhysicalDeviceProperties& properties() const { return properties_; }
  std::string device_name() const;
  /// Invocations per subgroup where compute shaders may broadcast within one
  /// (GL_KHR_shader_subgroup_ballot), else 0.
  std::uint32_t subgroup_size() const { return subgroup_size_; }
  /// Whether compute shaders may reduce across a subgroup (subgroupAdd, subgroupMax).
  bool subgroup_arithmetic() const { return subgroup_arithmetic_; }
  /// Whether storage buffers may hold 16-bit values (storageBuffer16BitAccess, enabled).
  bool storage16() const { return storage16_; }
  /// Whether shaders may compute with f16 values (shaderFloat16, enabled).
  bool float16() const { return float16_; }
  /// The cooperative-matrix fragment (M x N x K) the device multiplies f16 by f16 into f32 in a
  /// subgroup (offered_fragment's, its extension enabled), all 0 where it has none.
  const std::array<std::uint32_t, 3>& cooperative_fragment() const { return cooperative_fragment_; }
  /// Whether that fragment is VK_KHR_cooperative_matrix's: pipelines then get their kernels'
  /// SPIR-V translated from NV's (codegen::khr_cooperative_matrix).
  bool cooperative_khr() const { return cooperative_khr_; }
  /// Nanoseconds per timestamp tick on the compute queue, or 0 when it cannot write timestamps.
  double timestamp_period_ns() const { return timestamp_period_ns_; }
  /// Ticks between two timestamps written in this order: the counter has only
  /// timestampValidBits bits and may wrap between them.
  std::uint64_t ticks_between(std::uint64_t first, std::uint64_t second) const {
    return timestamp_bits_ >= 64 ? second - first : (second - first) & ((std::uint64_t{1} << timestamp_bits_) - 1);
  }

  /// A buffer of `size` bytes; host-visible ones are persistently mapped. Device-local memory is
  /// preferred for the rest.
  Buffer make_buffer(vk::DeviceSize size, vk::BufferUsageFlags usage, bool host_visible) const;
  /// Records commands with `record` into a one-off command buffer, submits it and waits.
  void submit_and_wait(const std::function<void(const vk::raii::CommandBuffer&)>& record) const;
  /// The features the device was created with, which every pipeline's SPIR-V is checked against.
  const DeviceFeatures& features() const { return features_; }
  /// Everything about the device that decides its kernels (choose_kernels, device_spirv).
  const DeviceProfile& profile() const { return profile_; }
  /// Each pipeline created so far: its kernel's name and what its SPIR-V needs of the device.
  std::vector<std::pair<std::string, codegen::SpirvNeeds>> kernel_needs() const;
  /// The pipeline of a kernel with these specialization constants (constant_id 0, 1, ...),
  /// compiled on first use and cached by name, source and constants. Its SPIR-V is first checked
  /// against features() (check_kernel): a mismatch is a BackendError naming the kernel and what
  /// the device lacks, never a driver's crash or a validation message.
  const Pipeline& pipeline(const codegen::KernelSource& k, const std::vector<std::uint32_t>& specialization = {});

 private:
  vk::raii::Context context_;
  vk::raii::Instance instance_{nullptr};
  vk::raii::DebugUtilsMessengerEXT messenger_{nullptr};
  vk::raii::PhysicalDevice physical_{nullptr};
  vk::PhysicalDeviceProperties properties_;
  vk::PhysicalDeviceMemoryProperties memory_properties_;
  std::uint32_t subgroup_size_ = 0;
  bool subgroup_arithmetic_ = false;
  bool storage16_ = false;
  bool float16_ = false;
  std::array<std::uint32_t, 3> cooperative_fragment_{};
  bool cooperative_khr_ = false;
  codegen::SpirvOptimization optimization_;  // of every pipeline's kernel
  std::uint32_t queue_family_ = 0;
  double timestamp_period_ns_ = 0;
  std::uint32_t timestamp_bits_ = 0;
  vk::raii::Device device_{nullptr};
  vk::raii::Queue queue_{nullptr};
  vk::raii::CommandPool pool_{nullptr};
  DeviceFeatures features_;
  DeviceProfile profile_;
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Pipeline>> pipelines_;
};

/// A device's subgroup size and the operations compute shaders may use (none before Vulkan 1.1).
struct SubgroupSupport {
  std::uint32_t size = 0;
  vk::SubgroupFeatureFlags operations;
  bool arithmetic = false, shuffle = false, ballot = false;
};
SubgroupSupport subgroup_support(const vk::raii::PhysicalDevice& d);
/// The fragment the cooperative-matrix matmul uses among those a device offers
/// (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV): f16 x f16 into f32 in a subgroup, 16 x 16
/// x 16 where offered, else the largest with sides multiples of 8 up to 32; all 0 for none.
std::array<std::uint32_t, 3> chosen_fragment(const std::vector<vk::CooperativeMatrixPropertiesNV>& offered);
/// The fragment a device's cooperative matrices give f16 kernels, and whether it is
/// VK_KHR_cooperative_matrix's (else VK_NV_cooperative_matrix's).
struct CooperativeOffer {
  std::array<std::uint32_t, 3> fragment{};
  bool khr = false;
  std::vector<vk::CooperativeMatrixPropertiesNV> offers;  // every product the extension lists (KHR's as NV's structure)
};
/// Whether a device offers the Vulkan memory model (VK_KHR_vulkan_memory_model), and with it
/// Device-scope synchronization (vulkanMemoryModelDeviceScope).
struct MemoryModelSupport {
  bool model = false, device_scope = false;
};
MemoryModelSupport memory_model_support(const vk::raii::PhysicalDevice& d);
/// chosen_fragment of what device d offers: VK_NV_cooperative_matrix's, which glslang compiles
/// the kernels to, or VK_KHR_cooperative_matrix's (AMD, Intel; the kernels' SPIR-V translated)
/// where the device has no NV one or `prefer_khr`; each only with its extension and feature, and
/// none without the Vulkan memory model (VK_KHR_vulkan_memory_model) the fragment loads use with
/// Device scope (vulkanMemoryModelDeviceScope), which the other kernels' atomics and buffer
/// barriers use: a device whose model lacks it runs the scalar kernels under GLSL's memory model,
/// where Device scope needs no feature.
CooperativeOffer offered_fragment(const vk::raii::Instance& instance, const vk::raii::PhysicalDevice& d, bool prefer_khr);

/// "discrete", "integrated", "virtual", "cpu" or "other".
const char* device_type_name(vk::PhysicalDeviceType t);

/// Runs `f`, turning Vulkan and loader exceptions into BackendError naming the call.
template <class F> auto guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const vk::SystemError& e) {
    throw BackendError(std::string("vulkan: ") + what + ": " + e.what());
  }
}

}  // namespace qkv::backend::vulkan
