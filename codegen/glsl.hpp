// IR nodes to GLSL compute shaders. A shader's source depends only on the op, its attributes and
// ranks; concrete sizes and strides travel as push constants, so one compiled shader serves
// every shape.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/storage_plan.hpp"

namespace qkv::codegen {

/// Push constants are 32 uint words (the 128 bytes every Vulkan device offers).
inline constexpr int kMaxPushWords = 32;

struct KernelSource {
  std::string name;  // e.g. "binary_add_r3"; a family (flex attention kernels of different
                     // modifiers share one), so pipelines are keyed by content
  std::string glsl;
  int buffers = 0;  // storage buffer bindings: the inputs in order, then the output
  /// The flash-attention kernels bind one more buffer after the output: two uints, the low and
  /// high words of the scores in the tiles they computed (the rest they skipped as masked).
  bool counts_tiles = false;
  /// The flash forward binds one more after those: its split buffer (KernelLaunch::split_words),
  /// where workgroups that split a row block's keys count their arrivals and leave their parts.
  bool splits_keys = false;
  /// The signature of the push constants the shader declares by name (PushConstants::signature):
  /// every kernel family declares its own once, for its shader and its launch.
  std::uint64_t push_signature = 0;
  /// Likewise for its specialization constants (SpecConstants::signature), where it has any.
  std::uint64_t spec_signature = 0;
};

/// A matmul workgroup computes a BM x BN tile of one batch entry's output, each of its
/// invocations TM x 4 TN4 outputs in registers, streaming A and B through shared memory BK deep.
/// Invocations are laid out WM x WN (WM = invocations / WN), so BM = WM TM and BN = 4 WN TN4.
struct MatmulGeometry {
  std::uint32_t invocations = 0, tm = 0, tn4 = 0, bk = 0, wn = 0;
  std::uint32_t bm() const { return invocations / wn * tm; }
  std::uint32_t bn() const { return 4 * wn * tn4; }
  std::int64_t shared_bytes() const { return 2 * static_cast<std::int64_t>(bk) * (bm() + bn()) * 4; }
  /// Why this geometry cannot run (sizes that do not divide, more shared memory than
  /// `shared_bytes` or invocations than `max_invocations`), or empty.
  std::string invalid(std::int64_t shared_bytes, std::uint32_t max_invocations) const;
  bool operator==(const MatmulGeometry&) const = default;
};

/// What code generation knows of the device that will run its kernels: launch geometry is chosen
/// from it, and so is which matmul kernel runs (the one source that depends on the device); the
/// rest of the GLSL is device-independent, and every source is cached by content.
struct Target {
  /// A Vulkan device that is a CPU (lavapipe): few, wide invocations that keep several rows
  /// each, since every shared-memory read is scalarised per lane. Otherwise a GPU: many
  /// invocations with one row each, so that the device has enough warps to hide memory latency
  /// and no row spills registers.
  bool cpu_device = true;
  /// Shared memory a workgroup may use (maxComputeSharedMemorySize; 16 KiB on every device).
  std::int64_t shared_bytes = 16384;
  /// Overrides of the flash-attention geometry for tuning experiments (0: chosen from `cpu_device`):
  /// invocations per workgroup, rows per invocation, and the most rows per shared tile.
  std::uint32_t attention_invocations = 0, attention_rows = 0, attention_tile = 0;
  /// Few queries against many keys (decoding) on a GPU (not `cpu_device`): the forward takes its
  /// decode layout, a workgroup's invocations sharing its query rows and taking keys of their own,
  /// merged by log-sum-exp, and a long cache is split over workgroups, the last to finish merging
  /// the parts (flash-decoding). Off: the query layout, unsplit.
  bool split_kv = true;
  /// Batch invariance for packed batches too (QKV_DETERMINISTIC=1): attention over packed
  /// sequences (a document mask, ir::document_mask_tensors) takes the scalar query layout, whose
  /// rows add their keys one at a time whatever the tiles, instead of the decode layout, the key
  /// split and cooperative matrices, whose sums group keys by their packed positions.
  bool deterministic = false;
  /// Invocations a workgroup may have (maxComputeWorkGroupInvocations; at least 128).
  std::uint32_t max_invocations = 128;
  /// Invocations per workgroup of the elementwise, layout, reduction and softmax kernels (the
  /// fused ones too): 256 by default (no device: `qkv dump --glsl`); for a device, choose_kernels
  /// takes the largest power of two it allows up to 256 (at least 128 on every Vulkan device).
  std::uint32_t invocations = 256;
  /// Invocations per subgroup where kernels may broadcast within one (subgroupBroadcast), or 0.
  std::uint32_t subgroup_size = 0;
  /// Reductions and softmax give each row a subgroup, combined by subgroupAdd and subgroupMax
  /// (GL_KHR_shader_subgroup_arithmetic), rather than one invocation per row.
  bool subgroup_reductions = false;
  /// Override of the matmul geometry for tuning experiments (invocations 0: chosen per shape).
  MatmulGeometry matmul{};
  /// Cooperative matrices for matmuls whose operands are f16 values (VK_NV_cooperative_matrix:
  /// f16 x f16 products accumulated in f32 by a subgroup, tensor cores on NVIDIA GPUs): the
  /// fragment's rows m, columns n and depth k, 0 where the device has none. `emulated` runs the
  /// same kernel with the fragment operations written as scalar code (for testing the kernel's
  /// tiling on devices without: lavapipe).
  struct CooperativeMatrix {
    std::uint32_t m = 0, n = 0, k = 0;
    bool emulated = false;
    bool operator==(const CooperativeMatrix&) const = default;
  } cooperative_matrix{};
  /// Storage ranges bind at multiples of this many bytes (minStorageBufferOffsetAlignment, at
  /// least 16): where slices and concat operands may lie in place (codegen::plan_storage); 0
  /// (no device: `qkv dump --glsl`): none do.
  std::int64_t view_alignment = 0;
  /// Storage buffers one shader may bind (maxPerStageDescriptorStorageBuffers); 0: no limit.
  /// A flash kernel reads a paged cache in place only where its block tables fit beside its
  /// operands (codegen::plan_storage).
  std::uint32_t storage_buffers = 0;
};

struct KernelLaunch {
  std::vector<std::uint32_t> push;
  std::array<std::uint32_t, 3> groups{1, 1, 1};
  /// Values of the shader's specialization constants (constant_id 0, 1, ...), for kernels whose
  /// register and shared-memory arrays are sized by the bound shapes (the head dims of the flash-
  /// attention kernels); empty for the rest. The pipeline is created per distinct list.
  std::vector<std::uint32_t> specialization;
  /// For a kernel that counts its tiles: every score it covers (batch entries x N x M), of which
  /// those not counted as computed were skipped.
  std::int64_t scores = 0;
  /// The signature of the declaration `push` was packed from: the kernel's own
  /// (KernelSource::push_signature), or the dispatch is refused.
  std::uint64_t push_signature = 0;
  /// The signature of the declaration `specialization` was set from (SpecConstants::signature).
  std::uint64_t spec_signature = 0;
  /// For a kernel that splits keys (KernelSource::splits_keys): 32-bit words of its split
  /// buffer, of which the first `split_counters` must be zero when it starts (0: no split).
  std::int64_t split_words = 0, split_counters = 0;
};

/// Whether the generator has a kernel of its own for this node; composites it has none for are
/// decomposed before code generation (softmax and the attention family have one, the latter up
/// to four batch dims; a flex modifier's score-shaped tensor gradient is decomposed).
bool implements(const ir::Node& n);
/// Whether n is a cast to or from f16 or bf16: a kernel of its own, never fused, converting
/// contiguous elements (where no other kernel reads or writes the 16-bit values in place: the
/// storage plan's half views and narrowed casts).
bool cast16(const ir::Graph& g, const ir::Node& n);
/// Nodes computed at each element of their kernel from their operands' values at that element:
/// unary, binary, select and comparison ops, and broadcast_to (its operand is read through
/// strides broadcast to the kernel's shape, like every operand of a smaller shape); not a
/// cast16. Fusion chains them into one kernel (codegen/fusion.cpp).
bool elementwise(const ir::Graph& g, const ir::Node& n);
/// Sums, maxima and softmax over one axis: a kernel of their own reading their input through
/// the elementwise chain that computes it (codegen/fusion.cpp).
bool axis_reduction(const ir::Node& n);
/// The storage buffers the node's kernel binds (KernelSource::buffers): its operands, its
/// output, and the flash kernels' tile counter (the tangent's: and the forward's output, which it
/// may write too: forward_beside). A device allows a limited number per shader
/// (maxPerStageDescriptorStorageBuffers: 32 on lavapipe); past it, the backend decomposes.
int storage_buffers(const ir::Node& n);
/// The forward attention node whose output the kernel of tangent node `v` (attention_jvp and its
/// masked and flex forms) also writes, as the cpu's one pass gives both: the node right before it
/// (ir::place_attention_lse puts it there) with the same operands and options, stored contiguous
/// (in its own storage, a 16-bit cast's it narrows into or a concat's; not placed into a permute);
/// -1 for every other node. That forward
/// node then has no kernel of its own (KernelGroup::beside).
ir::ValueId forward_beside(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v);
/// The tangent node whose kernel writes forward node `v`'s output (forward_beside's inverse), or -1.
ir::ValueId written_by_tangent(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v);
/// Why the Vulkan code generator cannot handle a node, or nullopt when it can.
std::optional<std::string> unsupported_reason(const ir::Graph& g, const ir::Node& n);
/// The shader of node `v` for `target` (only matmul's depends on it: see matmul_glsl.cpp),
/// reading and writing its values as `storage` holds them (codegen::plan_storage).
KernelSource kernel_source(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const Target& target = {});
/// Whether node `v`'s pipeline depends on the bound shapes and the device (KernelLaunch::specialization:
/// the flash kernels' head dims and geometry, the matmul's tile geometry).
bool specialized(const ir::Node& n);
/// How node `v`'s kernel divides its work at these shapes, in words, where that depends on them
/// (the flash forward's decode layout and key split); empty otherwise. What `qkv explain` shows.
std::string work_split(const ir::Graph& g, ir::ValueId v, const std::vector<ir::Shape>& shapes, const Target& target);
/// Push constants and workgroup counts of node `v` for concrete shapes (one per node).
KernelLaunch kernel_launch(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId v, const std::vector<ir::Shape>& shapes,
                           const Target& target = {});

}  // namespace qkv::codegen
