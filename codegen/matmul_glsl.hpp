// The matmul compute shader: register-blocked tiles through double-buffered shared memory, its
// geometry (MatmulGeometry) specialized per device and shape. Internal to codegen; glsl.cpp
// dispatches here.
#pragma once

#include <vector>

#include "codegen/glsl.hpp"

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
};

/// The lanes kernel on CPU devices with subgroup broadcasts, the tiled one elsewhere; with an
/// epilogue, its value is what each store writes.
KernelSource matmul_source(const ir::Node& n, const Target& target, const MatmulEpilogue* epilogue = nullptr);
/// Push-constant words of a matmul whose output has `rank` dims.
int matmul_push_words(int rank);
KernelLaunch matmul_launch(const ir::Node& n, const std::vector<ir::Shape>& shapes, const ir::Shape& out, const Target& target);

}  // namespace qkv::codegen::detail
