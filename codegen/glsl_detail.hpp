// Helpers the GLSL generators share. Internal to codegen.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "codegen/glsl.hpp"
#include "codegen/push_constants.hpp"
#include "ir/graph.hpp"

namespace qkv::codegen::detail {

/// A size or stride as a push-constant word (asserts that it fits in 32 bits).
std::uint32_t push_word(std::int64_t v);
/// Row-major element strides of a concrete shape.
std::array<std::int64_t, ir::kMaxRank> contiguous_strides(const ir::Shape& s);
/// Strides of `in` read as a tensor of `rank` dims it broadcasts to (aligned at the last dim):
/// 0 along the dims it lacks or has as 1.
std::array<std::int64_t, ir::kMaxRank> broadcast_strides(const ir::Shape& in, int rank);
/// GLSL `uint qkv_philox(uint index, uint seed)`: the first word of Philox4x32-10 as
/// ir/random.hpp defines it for dropout masks (counter (index, 0, 0, 0), key (seed, kDropoutKey1)).
std::string philox_function();

/// An elementwise op's GLSL expression over these operand expressions (a, b, or c, a, b for where).
std::string elementwise_expression(ir::Op op, const std::vector<std::string>& operands);
/// Declares, after `p`'s members, the `dims` of a kernel's elements and each of `operands`
/// operands' strides over them (strides_name; 0 where it broadcasts): the elementwise family's
/// and every fused chain's. Nothing for rank 0 (the loops over no dims are unrolled away).
void declare_operand_strides(PushConstants& p, int rank, int operands);
/// "x<operand>_strides".
std::string strides_name(int operand);
/// Sets those for elements of `shape` and operands of `operands` shapes (broadcast_strides).
void set_operand_strides(PushConstants::Values& push, const ir::Shape& shape, const std::vector<ir::Shape>& operands);
/// Statements that split element `i` into its indices along `rank` dims (pc.dims) and give each
/// operand k its offset o<k> through its strides (pc.x<k>_strides).
std::string operand_offsets(int rank, int operands);
/// The elementwise family's push constants: its `elements`, then declare_operand_strides'.
PushConstants elementwise_push_constants(int rank, int operands);
/// The push constants of axis_body's kernels (before a fused kernel's own): rows, n, inner, mode.
PushConstants axis_push_constants();
/// `value` rounded to f16 or bf16 by the kernel's qkv_round_f16 or qkv_round_bf16 (math_helpers_of
/// the round op defines them); `value` itself for f32.
std::string rounded_value(DType rounded, const std::string& value);
/// How a kernel stores each value: rounded to f16 or bf16 in f32 storage (`rounded`), and in
/// 16-bit storage (`held`), as the storage plan says (ir::ValueStorage).
struct Store {
  DType rounded = DType::f32, held = DType::f32;
  /// The stored expression for f32 `value`.
  std::string operator()(const std::string& value) const;
  /// The rounds whose helpers (math_helpers_of) the stores call.
  std::vector<ir::Op> rounds() const;
  /// The kernel name's suffix for them and for 16-bit operand buffers `inputs`: "_round_bf16"
  /// when rounding, "_bf16x1" for operand 1, "_f16y" for 16-bit output storage.
  std::string suffix(const std::vector<DType>& inputs = {}) const;
};
/// main() of a reduction or softmax over one axis (its push constants axis_push_constants',
/// a fused kernel's dims after them), reading its input's element e as open + e + close
/// ("x0[" and "]" unfused): one invocation per row, or with target.subgroup_reductions a
/// subgroup per row (a workgroup for long rows on a GPU: axis_launch).
/// `sum_order`: for a sum merged from several (fusion's), the chain shape's axis each of them
/// summed, the first's first: summed in nested loops in that order (see glsl.cpp, sum_row).
/// `store`: how each value is stored.
std::string axis_body(ir::Op op, const std::string& open, const std::string& close, const Target& target, const std::vector<int>& sum_order = {},
                      const Store& store = {});
/// A reduction a row kernel computes per row before its elements: `variable` = the sum or max
/// over the row of `function`(element).
struct RowReduction {
  ir::Op op;
  std::string variable, function;
};
/// main() of a row kernel (codegen/fusion.cpp): per row of n elements (the words of axis_body),
/// each reduction in order, then y at each of the row's elements = `chain`(element), which may
/// read the reductions' variables. The rows are taken as axis_body takes them for `target`.
std::string row_body(const std::vector<RowReduction>& reductions, const std::string& chain, const Target& target, const Store& store = {});
/// header + body for an axis_body kernel, with the subgroup extensions it needs for `target`.
std::string axis_shader(const std::string& header, const std::string& body, const Target& target);
/// Workgroups of axis_body's kernel for these sizes, setting its axis_push_constants in `push`.
KernelLaunch axis_launch(std::int64_t outer, std::int64_t n, std::int64_t inner, const Target& target, PushConstants::Values& push);
/// The buffer and push-constant (`push`) declarations of a kernel reading buffers x0, x1, ... that hold
/// `inputs` and writing y that holds `out` (held_element: 16-bit ones with
/// GL_EXT_shader_16bit_storage), with the target's invocations along x (Target::invocations); a
/// kernel reads x<k> through widened and stores through a Store.
std::string kernel_header(const std::vector<DType>& inputs, DType out, const PushConstants& push, const Target& target);
/// The statements that give an elementwise kernel its element `i` (pc.elements) and return
/// past the last.
std::string linear_index();
/// Workgroups of kernel_header's kernels for `total` elements (past 65535 along x, rows along y).
std::array<std::uint32_t, 3> elementwise_groups(std::int64_t total, const Target& target);
/// How a buffer holds values of `t` (GL_EXT_shader_16bit_storage for the 16-bit ones): f16 as
/// float16_t, bf16 as the high half of an f32 in a uint16_t, every other dtype as float.
const char* held_element(DType t);
/// `element`, an expression of held_element(t), as an f32 (exact).
std::string widened(DType t, const std::string& element);
/// f32 `value` as a held_element(t), rounded to nearest even first (the value is then exact in
/// 16 bits, whatever the device's conversion rounds to); calls qkv_round_f16 or qkv_round_bf16.
std::string narrowed(DType t, const std::string& value);
/// The GLSL helpers (qkv_log, qkv_tanh, qkv_erf, qkv_sin, qkv_cos, ...) that any of `ops` calls, each once.
std::string math_helpers_of(const std::vector<ir::Op>& ops);
/// The GLSL helpers (qkv_log, qkv_tanh, qkv_erf, qkv_sin, qkv_cos, ...) that a region's ops call, with qkv_log also
/// when `log`: each once, to be placed before the region's functions.
std::string math_helpers(const ir::Graph& region, bool log);
/// A flex-attention score modifier (ir/region.hpp) as a GLSL function
/// `float name(float score, uint q_idx, uint kv_idx)` returning its output `outputs[0]`, or with
/// two outputs a `vec2 name(...)` of both. Tensor input t<i> reads T<i>[t<i>_at + q_idx * t<i>_row
/// + kv_idx * t<i>_col]: the caller declares those arrays and offsets. One line per region node.
std::string region_function(const ir::Graph& region, const std::string& name, const std::vector<std::string>& outputs);
/// GLSL interval arithmetic with ir::bound_region's rules: `struct Iv { float lo, hi; bool nan; }`
/// and one iv_<op> per elementwise op, with those for the increasing functions `region` uses
/// (after math_helpers), when given.
std::string interval_helpers(const ir::Graph* region);
/// The region's output range as a GLSL function `Iv name(Iv q_idx, Iv kv_idx, Iv t0, ...)` of
/// its inputs' ranges (the score is unknown): ir::bound_region emitted node by node. With
/// `keeps` (ir::masking_conditions), `bool name(...)` instead: whether every one of those
/// conditions provably selects its keeping branch over the ranges.
std::string region_bound_function(const ir::Graph& region, const std::string& name, const std::vector<std::pair<ir::ValueId, bool>>* keeps = nullptr);

}  // namespace qkv::codegen::detail
