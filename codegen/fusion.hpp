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
  bool fused() const { return !inlined.empty(); }
};

/// Limits a fused kernel must keep: storage buffers per shader, at most 16 and never more than
/// the device's maxPerStageDescriptorStorageBuffers (the vulkan backend lowers the default to it).
struct FusionLimits {
  int storage_buffers = 16;
};

/// The kernels of `g`, one per node that has one, in node order. Elementwise chains are fused:
/// an elementwise node (unary, binary, where, comparisons) is computed inside the elementwise
/// kernel that reads it when it has the kernel's shape, is no result, and every node that reads
/// it is in that kernel; constants are computed inside every elementwise kernel that reads
/// them (and get a kernel of their own only where another kernel reads them). A fused kernel's
/// operands fit its push constants and `limits`. Verified before it is returned (each inlined
/// node is read only inside its kernel; every operand is stored by an earlier kernel or is an
/// input or a view).
std::vector<KernelGroup> plan_kernels(const ir::Graph& g, const FusionLimits& limits = {});

/// One kernel per node that has one, each reading its node's operands (fusion off).
std::vector<KernelGroup> unfused_kernels(const ir::Graph& g);

/// A fused kernel's name: "fused_", the ops it computes, its rank ("fused_div_mul_add_r3").
std::string fused_name(const ir::Graph& g, const KernelGroup& k);
/// The shader of a fused kernel: its nodes as one expression per element.
KernelSource fused_source(const ir::Graph& g, const KernelGroup& k);
/// Push constants and workgroups of a fused kernel for concrete shapes.
KernelLaunch fused_launch(const ir::Graph& g, const KernelGroup& k, const std::vector<ir::Shape>& shapes);
/// "%4 div, %5 sub, %6 mul": the nodes a kernel covers, root last.
std::string covered_nodes(const ir::Graph& g, const KernelGroup& k);

}  // namespace qkv::codegen
