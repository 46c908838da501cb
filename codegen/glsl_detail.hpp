// Helpers the GLSL generators share. Internal to codegen.
#pragma once

#include <cstdint>

namespace qkv::codegen::detail {

/// A size or stride as a push-constant word (asserts that it fits in 32 bits).
std::uint32_t push_word(std::int64_t v);
/// GLSL `float qkv_log(float)`: log to float precision near 1 (the built-in is not; see glsl.cpp).
extern const char* const kGlslLog;

}  // namespace qkv::codegen::detail
