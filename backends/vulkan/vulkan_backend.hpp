// The Vulkan backend: generated compute shaders, one command buffer per run, buffers reused.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"

namespace qkv::backend {

struct VulkanOptions {
  /// Picks the device whose name contains this text (QKV_VULKAN_DEVICE); empty: the best one,
  /// a discrete GPU first, then integrated, virtual, and the CPU (lavapipe) last.
  std::string device_filter;
  /// Enables VK_LAYER_KHRONOS_validation and counts its messages (QKV_VULKAN_VALIDATION=1).
  bool validation = false;
  /// The kernels' launch geometry (codegen::Target, QKV_VULKAN_TUNING=cpu|gpu): by default
  /// "cpu" for a CPU device (lavapipe) and "gpu" for the rest. Results are the same either way
  /// (within the float budgets); tests run both geometries on whatever device they have.
  enum class Tuning { automatic, cpu, gpu } tuning = Tuning::automatic;
  /// For tuning experiments: the flash-attention kernels' invocations per workgroup, rows per
  /// invocation and most rows per shared tile (QKV_VULKAN_ATTENTION_GEOMETRY=64,1,64; 0 or
  /// unset: chosen by `tuning`).
  std::uint32_t attention_invocations = 0, attention_rows = 0, attention_tile = 0;
  /// On a GPU, few queries against many keys (decoding) take the flash forward's decode layout,
  /// keys spread over the invocations and split over workgroups (codegen::Target::split_kv;
  /// QKV_VULKAN_SPLIT_KV=0: the query layout unsplit, as on lavapipe, for comparisons).
  bool split_kv = true;
  /// Batch invariance for packed (varlen) batches on every device (codegen::Target::deterministic;
  /// QKV_DETERMINISTIC=1): their attention takes the scalar query layout. Off, a GPU's decode
  /// layout, key split and cooperative matrices serve them too, their bits then depending on
  /// where a sequence is packed.
  bool deterministic = false;
  /// For tuning experiments: every matmul's geometry (codegen::MatmulGeometry) as invocations,
  /// rows per invocation, vec4 columns per invocation, tile depth and invocations across the
  /// columns (QKV_VULKAN_MATMUL_GEOMETRY=256,8,2,8,16; all 0 or unset: chosen per device and shape).
  std::array<std::uint32_t, 5> matmul_geometry{};
  /// Fuses elementwise chains into one kernel each (codegen::plan_kernels; QKV_VULKAN_FUSION=0
  /// turns it off: one kernel per node, for comparisons).
  bool fusion = true;
  /// Reductions and softmax give each row a subgroup (subgroupAdd, subgroupMax) where the device
  /// has subgroup arithmetic (QKV_VULKAN_SUBGROUP_REDUCTIONS=0: one invocation per row, for
  /// comparisons).
  bool subgroup_reductions = true;
  /// f16 and bf16 inputs, outputs and held tensors stay 16-bit on the device, widened and
  /// narrowed there by cast kernels, where it has 16-bit storage buffers
  /// (QKV_VULKAN_HALF_STORAGE=0: widened and narrowed on the host, as on devices without).
  bool half_storage = true;
  /// Matmuls and attention whose operands are f16 values run on cooperative matrices (f16
  /// products, f32 accumulation: tensor cores) where the device has them,
  /// VK_NV_cooperative_matrix or else VK_KHR_cooperative_matrix (QKV_VULKAN_COOPERATIVE_MATRIX=auto,
  /// the default); `off` (0) keeps the scalar kernels; `on` (1) requires them, an error on a
  /// device without; `khr` requires VK_KHR_cooperative_matrix and uses it even where NV's is
  /// offered (NVIDIA offers both: how the translated kernels run there); `emulated` (emulate)
  /// runs the cooperative kernels with their fragment operations as scalar code, on any device
  /// with f16 arithmetic (to test the kernels where no device has cooperative matrices).
  enum class CooperativeMatrix { automatic, off, on, khr, emulated } cooperative_matrix = CooperativeMatrix::automatic;
  /// The fragment (rows, columns, depth) the emulated kernels use: NVIDIA's 16 x 16 x 16 by
  /// default; tests pick others to run the kernels' other lane layouts on the subgroups at hand
  /// (4 x 8 x 8 gives lavapipe's subgroups of 8 two lanes per score row, as NVIDIA's 32 lanes
  /// over 16 rows).
  std::array<std::uint32_t, 3> emulated_fragment{16, 16, 16};
  /// Runs spirv-opt's performance passes on each kernel (codegen::SpirvOptimization;
  /// QKV_VULKAN_OPTIMIZE_SPIRV=0 skips them, for a faster compile; the test programs do).
  bool optimize_spirv = true;
};

/// Options from the environment variables named above.
VulkanOptions vulkan_options_from_env();

/// Starts Vulkan. Throws BackendError naming what is missing (loader, device, layer).
std::unique_ptr<Backend> make_vulkan_backend(const VulkanOptions& options = vulkan_options_from_env());

/// The shaders the vulkan backend runs for `g` on the device `options` pick, after its lowering:
/// each kernel with the nodes it covers, fused and specialized for the device as runs are
/// (what `qkv dump --glsl` prints). No pipeline is created; with no device at hand, the shaders
/// for a GPU with common limits, said so in their first line.
std::string vulkan_shaders(const ir::Graph& g, const VulkanOptions& options = vulkan_options_from_env());

/// What the code generator has kernels for (codegen::implements); no device needed.
bool vulkan_supports(const ir::Node& n);

/// A Vulkan device and what it offers kernels (what qkv devices prints).
struct VulkanDeviceInfo {
  std::string name;                       // "NVIDIA H100 80GB HBM3"
  std::string type;                       // discrete, integrated, virtual, cpu or other
  std::string api;                        // "1.3"
  std::uint32_t subgroup_size = 0;        // invocations per subgroup (a warp, a wave, a SIMD width)
  bool subgroup_arithmetic = false;       // subgroupAdd/subgroupMax in compute shaders
  bool subgroup_shuffle = false;          // subgroupShuffle in compute shaders
  std::uint32_t shared_memory_bytes = 0;  // maxComputeSharedMemorySize
  std::uint32_t max_invocations = 0;      // maxComputeWorkGroupInvocations
  bool float16 = false;                   // shaderFloat16 (f16 arithmetic)
  bool int8 = false;                      // shaderInt8
  bool storage16 = false;                 // storageBuffer16BitAccess (f16 buffers)
  bool cooperative_matrix = false;        // VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix
  /// The f16 fragment (M x N x K) the cooperative-matrix kernels would use, all 0 where the
  /// device has none usable (vulkan::offered_fragment), and whether it is VK_KHR's.
  std::array<std::uint32_t, 3> cooperative_fragment{};
  bool cooperative_khr = false;
  /// VK_KHR_vulkan_memory_model's vulkanMemoryModel, and vulkanMemoryModelDeviceScope with it
  /// (the cooperative kernels need both: enabling the model without its Device scope would forbid
  /// the other kernels' Device-scope atomics and barriers).
  bool memory_model = false, memory_model_device_scope = false;
  bool timestamps = false;  // its compute queue writes timestamps (profiling)
  /// "subgroup 32 (arithmetic, shuffle), 48 KiB shared memory, ..." on one line.
  std::string capabilities() const;
};

/// Every Vulkan device the loader sees. Throws BackendError when there is no loader.
std::vector<VulkanDeviceInfo> vulkan_devices();

/// Validation-layer warnings and errors seen so far in this process (tests require none).
std::uint64_t vulkan_validation_messages();

}  // namespace qkv::backend
