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
#include "ir/passes/memory_plan.hpp"

namespace qkv::codegen {

/// Push constants are 32 uint words (the 128 bytes every Vulkan device offers).
inline constexpr int kMaxPushWords = 32;

struct KernelSource {
  std::string name;  // e.g. "binary_add_r3"; a family (flex attention kernels of different
                     // modifiers share one), so pipelines are keyed by content
  std::string glsl;
  int buffers = 0;   // storage buffer bindings: the inputs in order, then the output
  /// The flash-attention kernels bind one more buffer after the output: two uints, the low and
  /// high words of the scores in the tiles they computed (the rest they skipped as masked).
  bool counts_tiles = false;
  /// The signature of the push constants the shader declares (PushConstants::signature), for
  /// the families that declare theirs by name; 0 for the rest.
  std::uint64_t push_signature = 0;
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
};

/// Whether the generator has a kernel of its own for this node; composites it has none for are
/// decomposed before code generation (softmax and the attention family have one, the latter up
/// to four batch dims; a flex modifier's score-shaped tensor gradient is decomposed).
bool implements(const ir::Node& n);
/// Whether a node runs as a kernel (inputs are uploaded; reshapes alias their operand).
bool has_kernel(const ir::Node& n);
/// Whether n is a cast to or from f16 or bf16: a kernel of its own, never fused, converting
/// contiguous elements (where no other kernel reads or writes the 16-bit values in place:
/// half_view, narrowed_into).
bool cast16(const ir::Graph& g, const ir::Node& n);
/// Nodes computed at each element of their kernel from their operands' values at that element:
/// unary, binary, select and comparison ops, and broadcast_to (its operand is read through
/// strides broadcast to the kernel's shape, like every operand of a smaller shape); not a
/// cast16. Fusion chains them into one kernel (codegen/fusion.cpp).
bool elementwise(const ir::Graph& g, const ir::Node& n);
/// Sums, maxima and softmax over one axis: a kernel of their own reading their input through
/// the elementwise chain that computes it (codegen/fusion.cpp).
bool axis_reduction(const ir::Node& n);
/// Where node v's value lies in its operand's storage when it is a view and needs no kernel: a
/// reshape, a head view, a half view or an exact round at byte 0; a slice whose elements are contiguous in its operand (every dim before
/// the axis is 1, those after it static) at begin * inner size * 4 bytes, when that is a
/// multiple of `alignment` (a descriptor's offset must be: minStorageBufferOffsetAlignment);
/// alignment 0 views no slice. nullopt for every other node.
std::optional<std::int64_t> view_offset(const ir::Graph& g, ir::ValueId v, std::int64_t alignment);
/// has_kernel, and not a view for this alignment, nor a permute its operand's kernel writes.
bool has_kernel(const ir::Graph& g, ir::ValueId v, std::int64_t view_alignment);
/// Whether permute v is a head view: it keeps the last dim last, every reader is a flash kernel
/// reading it as q, k, v or dy (which take row and batch strides), and its operand is laid out
/// contiguously; then it has no kernel and aliases its operand at byte 0 (view_offset), read
/// through its permuted strides ([B, N, H, D] projections read as [B, H, N, D] heads).
bool head_view(const ir::Graph& g, ir::ValueId v);
/// Whether v, the cast to f32 of an f16 or bf16 input, has no kernel because every reader is a
/// flash kernel reading it as q, k, v or dy, a matmul reading it as A or B, an elementwise node
/// or an axis reduction (whatever kernel computes it, which reads v as an operand), all of which
/// widen the 16-bit values where they load them: it aliases the input.
bool half_view(const ir::Graph& g, ir::ValueId v);
/// The cast to f16 or bf16 that is the only reader of v, a flash forward kernel (attention,
/// masked or flex), a matmul, an elementwise node or an axis reduction, when v is no result and
/// has a kernel: v's kernel writes its output rounded into the cast's 16-bit storage, and the
/// cast has no kernel. -1 otherwise.
ir::ValueId narrowed_into(const ir::Graph& g, ir::ValueId v);
/// Whether every value of v is a `dtype` (f16 or bf16) number: v has that dtype, rounds to it,
/// is the cast of such a value, or moves such values (a reshape, permute, slice, broadcast,
/// concat, negation or select of them). In a half graph (ir::emulate_half_precision) every
/// value the original graph typed f16 is one.
bool rounded_to(const ir::Graph& g, ir::ValueId v, DType dtype);
/// f16 or bf16 where v's kernel stores its values rounded to that dtype, f32 otherwise: v is a
/// flash-attention node (any of the family), a softmax, or a sum or max over an axis, it is no
/// result, and its one reader is a round to that dtype (a half graph rounds the result of every
/// such op), which is then a view of v's storage (exact_round) rather than a kernel. A sum or max
/// that keeps its dim is left alone where the round has elementwise readers: fusion may compute
/// it inside their kernel, per row.
DType rounded_on_store(const ir::Graph& g, ir::ValueId v);
/// Whether v is a round_f16 or round_bf16 of values already of its dtype (a half graph rounds
/// the result of every half op, a permute's or a slice's too) held in a layout op's, a cast's
/// or a round's storage: the identity, so a view of that storage with no kernel (view_offset).
bool exact_round(const ir::Graph& g, ir::ValueId v);
/// The dtype v's storage holds: f16 or bf16 for a half-typed value, a half view and a flash or
/// matmul output narrowed into a cast, f32 for the rest (bool and i32 values are held as floats).
DType held_dtype(const ir::Graph& g, ir::ValueId v);
/// The permute (keeping the last dim last) that is the only reader of flash-kernel output v,
/// when v is not a result: v's kernel writes its output into that permute's storage through
/// the permuted strides ([B, H, N, D] heads stored as [B, N, H, D]), and the permute has no
/// kernel. -1 otherwise.
ir::ValueId placed_into(const ir::Graph& g, ir::ValueId v);
/// Whether concat v has no kernel because its operands' kernels write their results into it:
/// each operand is a contiguous run of it (the dims before the axis are 1, every dim static, the
/// second operand's offset a multiple of `alignment`), has storage of its own written by a
/// kernel (or is such a concat), is no input, and is read by no other concat (the packed QKV
/// weight's and bias's gradients, concat(concat(dq, dk), dv)).
bool concat_in_place(const ir::Graph& g, ir::ValueId v, std::int64_t alignment);
/// Where v's kernel writes its result when that lies in a later value's storage: an attention's
/// output in its permute's (placed_into), a concat's operand in the concat at its byte offset.
std::optional<ir::Placement> written_into(const ir::Graph& g, ir::ValueId v, std::int64_t alignment);
/// The storage buffers the node's kernel binds (KernelSource::buffers): its operands, its
/// output, and the flash kernels' tile counter. A device allows a limited number per shader
/// (maxPerStageDescriptorStorageBuffers: 32 on lavapipe); past it, the backend decomposes.
int storage_buffers(const ir::Node& n);
/// Why the Vulkan code generator cannot handle a node, or nullopt when it can.
std::optional<std::string> unsupported_reason(const ir::Graph& g, const ir::Node& n);
/// The shader of node `v` for `target` (only matmul's depends on it: see matmul_glsl.cpp).
KernelSource kernel_source(const ir::Graph& g, ir::ValueId v, const Target& target = {});
/// Whether node `v`'s pipeline depends on the bound shapes and the device (KernelLaunch::specialization:
/// the flash kernels' head dims and geometry, the matmul's tile geometry).
bool specialized(const ir::Node& n);
/// Push constants and workgroup counts of node `v` for concrete shapes (one per node).
KernelLaunch kernel_launch(const ir::Graph& g, ir::ValueId v, const std::vector<ir::Shape>& shapes, const Target& target = {});

}  // namespace qkv::codegen
