// What a SPIR-V compute module asks of the device that runs it, read from its instructions: the
// facts a Vulkan driver checks at vkCreateComputePipelines (or silently miscompiles), so that the
// backend can check them first against what it created the device with (vulkan::check_kernel).
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace qkv::codegen {

struct SpirvNeeds {
  /// The header's version word (0x00010300 for SPIR-V 1.3).
  std::uint32_t version = 0;
  /// OpCapability operands (spv::Capability) and OpExtension names.
  std::set<std::uint32_t> capabilities;
  std::set<std::string> extensions;
  /// OpMemoryModel's memory model (spv::MemoryModel: GLSL450 1, Vulkan 3).
  std::uint32_t memory_model = 0;
  /// The memory scopes (spv::Scope: Device 1, Workgroup 2, Subgroup 3, QueueFamily 5) of atomics,
  /// control and memory barriers, and the execution scopes of barriers and group operations.
  std::set<std::uint32_t> memory_scopes, execution_scopes;
  /// A cooperative-matrix multiply-add: A is m x k, B k x n, C and the result m x n. Component
  /// types are numbered as VkComponentTypeKHR (f16 0, f32 1, ...), the scope as spv::Scope.
  struct Product {
    std::uint32_t m = 0, n = 0, k = 0;
    std::uint32_t a = 0, b = 0, c = 0, result = 0;
    std::uint32_t scope = 0;
    bool khr = false;  // SPV_KHR_cooperative_matrix's (else SPV_NV_cooperative_matrix's)
    bool operator<(const Product& o) const;
  };
  std::set<Product> products;
  /// Invocations per workgroup (LocalSize, LocalSizeId or the WorkgroupSize built-in, with the
  /// specialization constants applied).
  std::array<std::uint32_t, 3> workgroup_size{1, 1, 1};
  /// Bytes of the Workgroup storage class's variables (shared memory), each at its natural size,
  /// in all and one by one (in declaration order).
  std::uint64_t shared_bytes = 0;
  std::vector<std::uint64_t> shared_variables;
  /// Storage buffers the module binds (variables of the StorageBuffer storage class).
  std::uint32_t storage_buffers = 0;
  /// Bytes of the push-constant block (its last member's offset plus its size).
  std::uint32_t push_constant_bytes = 0;
  /// What could not be sized or evaluated (a specialization-constant operation this reader does
  /// not know), so that a check leaves it out rather than guess; empty for every kernel qkv makes.
  std::vector<std::string> unknown;
};

/// Reads `words` with constant_id i taking `specialization[i]` where given (its default
/// otherwise). Throws BackendError for a module that is not SPIR-V or is cut short.
SpirvNeeds spirv_needs(const std::vector<std::uint32_t>& words, const std::vector<std::uint32_t>& specialization = {});

/// spv::Capability's name for the capabilities qkv's kernels may declare (and a few more), else
/// "capability N".
std::string capability_name(std::uint32_t capability);
/// "Device", "Workgroup", "Subgroup", "QueueFamily", ... for a spv::Scope.
std::string scope_name(std::uint32_t scope);
/// "f16", "f32", "i8", "u32", ... for a VkComponentTypeKHR value.
std::string component_name(std::uint32_t component);

}  // namespace qkv::codegen
