// Kernel fusion for code generation: which IR nodes one generated kernel computes together.
#pragma once

#include <string>
#include <vector>

#include "codegen/glsl.hpp"

namespace qkv::codegen {

/// One kernel: the node whose value it stores (`root`), the nodes it computes on the way in
/// registers (`inlined`, in node order; they get no buffer), and the values it reads from
/// memory (`operands`, in binding order). An unfused kernel has no inlined nodes and reads its
/// root's operands.
struct KernelGroup {
  ir::ValueId root = -1;
  std::vector<ir::ValueId> inlined;
  std::vector<ir::ValueId> operands;
  /// A second value the kernel stores, bound after its root's (forward_beside: the forward output
  /// an attention tangent's kernel writes too), or -1.
  ir::ValueId beside = -1;
  bool fused() const { return !inlined.empty(); }
};

/// Limits a fused kernel must keep: storage buffers per shader, at most 16 and never more than
/// the device's maxPerStageDescriptorStorageBuffers (the vulkan backend lowers the default to it).
struct FusionLimits {
  int storage_buffers = 16;
};

/// The kernels of `g`, one per node that has one, in node order. Elementwise chains are fused:
/// an elementwise node (unary, binary, where, comparisons) that is no result is computed inside
/// the elementwise kernel that reads it, alone when every node that reads it is there, or
/// recomputed in each kernel that reads it (at most four) when all of them can compute it; a
/// node of a smaller shape is recomputed at every element it broadcasts to. A matmul of the
/// kernel's shape is fused as the kernel's core, its chain then computed in the matmul's store
/// (the epilogue); reductions and softmax read their input through its chain; constants are
/// computed inside every elementwise kernel that reads them (and get a kernel of their own only
/// where another kernel reads them). Values `storage` gives no kernel (views, values written in
/// place) are read where they lie. A fused kernel's operands fit its push constants and
/// `limits`. Verified before it is returned: every value a kernel, a view or a result reads from
/// memory is stored by an earlier kernel or is an input or a view.
std::vector<KernelGroup> plan_kernels(const ir::Graph& g, const ir::StoragePlan& storage, const FusionLimits& limits = {});

/// One kernel per node that has one in `storage`, each reading its node's operands (fusion off).
std::vector<KernelGroup> unfused_kernels(const ir::Graph& g, const ir::StoragePlan& storage);

/// A fused kernel's name: "fused_", the ops it computes, its rank ("fused_div_mul_add_r3"); an
/// epilogue's matmul is named by the kernel `target` multiplies it with (matmul_family:
/// "fused_matmul_coop16x16x16_add_r3", "fused_matmul_lanes8_add_max_r3").
std::string fused_name(const ir::Graph& g, const ir::StoragePlan& storage, const KernelGroup& k, const Target& target);
/// The shader of a fused kernel: its nodes as one expression per element, or for a matmul with
/// an epilogue the matmul kernel for `target` storing the chain's value at each product.
KernelSource fused_source(const ir::Graph& g, const ir::StoragePlan& storage, const KernelGroup& k, const Target& target = {});
/// Push constants and workgroups of a fused kernel for concrete shapes.
KernelLaunch fused_launch(const ir::Graph& g, const ir::StoragePlan& storage, const KernelGroup& k, const std::vector<ir::Shape>& shapes,
                          const Target& target = {});
/// Whether a kernel's pipeline depends on the bound shapes (codegen::specialized; a matmul with an
/// epilogue is).
bool specialized(const ir::Graph& g, const KernelGroup& k);
/// Every kernel of a graph for these limits and this target (fused, or with `fuse` false one per
/// node), each headed by the node it stores and the nodes it computes inside, after the values
/// with no kernel and why (the storage plan's views and values written in place): what `qkv
/// dump --glsl` prints (for the vulkan device: backend::vulkan_shaders).
std::string emit_glsl(const ir::Graph& g, const ir::StoragePlan& storage, const FusionLimits& limits = {}, const Target& target = {},
                      bool fuse = true);
/// "%4 div, %5 sub, %6 mul": the nodes a kernel covers, root last.
std::string covered_nodes(const ir::Graph& g, const KernelGroup& k);

}  // namespace qkv::codegen
