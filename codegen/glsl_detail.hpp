// Helpers the GLSL generators share. Internal to codegen.
#pragma once

#include <array>
#include <cstdint>

#include "ir/shape.hpp"

namespace qkv::codegen::detail {

/// A size or stride as a push-constant word (asserts that it fits in 32 bits).
std::uint32_t push_word(std::int64_t v);
/// Row-major element strides of a concrete shape.
std::array<std::int64_t, ir::kMaxRank> contiguous_strides(const ir::Shape& s);
/// Strides of `in` read as a tensor of `rank` dims it broadcasts to (aligned at the last dim):
/// 0 along the dims it lacks or has as 1.
std::array<std::int64_t, ir::kMaxRank> broadcast_strides(const ir::Shape& in, int rank);
/// GLSL `float qkv_log(float)`: log to float precision near 1 (the built-in is not; see glsl.cpp).
extern const char* const kGlslLog;

}  // namespace qkv::codegen::detail
