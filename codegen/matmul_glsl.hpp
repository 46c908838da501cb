// The matmul compute shader: register-blocked tiles through double-buffered shared memory, its
// geometry (MatmulGeometry) specialized per device and shape. Internal to codegen; glsl.cpp
// dispatches here.
#pragma once

#include <functional>
#include <vector>

#include "codegen/glsl.hpp"
#include "codegen/push_constants.hpp"

namespace qkv::codegen::detail {

/// The geometry for an M x N output on `target`: the target's override when it sets one, else
/// the measured default for the device kind, narrowed for thin shapes (M or N below a tile).
MatmulGeometry matmul_geometry(const Target& target, std::int64_t m, std::int64_t n);
/// What a matmul kernel computes in its store (kernel fusion's epilogue: bias adds, activations,
/// residual adds). `glsl` defines `float qkv_epilogue(float acc, uint row, uint col)`, the value
/// stored at output element (row, col) of the current batch entry given the product `acc` there,
/// and `void qkv_epilogue_batch(uint batch)`, called once with the batch entry before any store;
/// it reads `operands` more buffers, bound after A and B (x2, x3, ...), the output after them.
struct MatmulEpilogue {
  std::string name;  // appended to the kernel's name ("_add_max")
  std::string glsl;
  int operands = 0;
  std::vector<DType> held;  // the dtypes the operands' buffers hold (f32 where missing)
  PushConstants push;       // its push constants, declared after the matmul's
};

/// The dtypes a matmul kernel's buffers hold (ir::ValueStorage::held): A and B may be f16 or bf16
/// (a half input read in place, widened exactly as it is loaded), the output f16 or bf16 (the
/// product rounded once as it is stored into its cast's storage: a narrowed cast).
struct MatmulDtypes {
  DType a = DType::f32, b = DType::f32, out = DType::f32;
  /// A's and B's values are all f16 numbers (held in f16, or f32 values the graph rounded to
  /// f16): a product of them in f16 with f32 accumulation is exact where an f32 one is.
  bool f16_values = false;
};
/// The dtypes of matmul `mm`'s buffers, and whether its operands are f16 values; `own_output`:
/// its kernel stores the matmul's own value (not a fused epilogue's), possibly narrowed.
MatmulDtypes matmul_dtypes(const ir::Graph& g, const ir::StoragePlan& storage, ir::ValueId mm, bool own_output);
/// Whether the matmul kernel for these operands on `target` multiplies with cooperative
/// matrices: the target has them (Target::cooperative_matrix) and A and B are f16 values.
bool uses_cooperative_matrix(const Target& target, const MatmulDtypes& dtypes);
/// Which of the three kernels matmul_source gives, as its name begins: "matmul_coop16x16x16"
/// ("matmul_coop_emulated16x16x16"), "matmul_lanes8" (the subgroup size) or "matmul" (tiled).
std::string matmul_family(const Target& target, const MatmulDtypes& dtypes);
/// The cooperative-matrix kernel where uses_cooperative_matrix, else the lanes kernel on CPU
/// devices with subgroup broadcasts and the tiled one elsewhere; with an epilogue, its value is
/// what each store writes.
KernelSource matmul_source(const ir::Node& n, const Target& target, const MatmulDtypes& dtypes = {}, const MatmulEpilogue* epilogue = nullptr);
/// The matmul family's push constants for an output of `rank` dims (M, N, K, the operands' row
/// and depth strides, the batch dims and the operands' batch strides), then an epilogue's.
PushConstants matmul_push_constants(int rank, const PushConstants* epilogue = nullptr);
/// The three matmul kernels: tiles through shared memory, subgroup lanes, cooperative matrices.
enum class MatmulKernel : std::uint8_t { tiled, lanes, cooperative };
/// Each kernel's specialization constants, by name: the tiled one's geometry (MatmulGeometry),
/// the lanes one's tile (subgroups, row groups, columns), the cooperative one's invocations.
SpecConstants matmul_spec_constants(MatmulKernel kernel);
/// Push-constant words of a matmul whose output has `rank` dims.
int matmul_push_words(int rank);
/// Push constants, specialization and workgroups of matmul `n` for these shapes; with an
/// epilogue, its push constants are declared by `epilogue` and set by `set_epilogue`.
KernelLaunch matmul_launch(const ir::Node& n, const std::vector<ir::Shape>& shapes, const ir::Shape& out, const Target& target,
                           const MatmulDtypes& dtypes = {}, const PushConstants* epilogue = nullptr,
                           const std::function<void(PushConstants::Values&)>& set_epilogue = {});

}  // namespace qkv::codegen::detail
