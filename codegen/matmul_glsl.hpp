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
/// The lanes kernel on CPU devices with subgroup broadcasts, the tiled one elsewhere.
KernelSource matmul_source(const ir::Node& n, const Target& target);
/// Push-constant words of a matmul whose output has `rank` dims.
int matmul_push_words(int rank);
KernelLaunch matmul_launch(const ir::Node& n, const std::vector<ir::Shape>& shapes, const ir::Shape& out, const Target& target);

}  // namespace qkv::codegen::detail
