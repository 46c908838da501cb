// GLSL to SPIR-V with libshaderc, cached by a hash of the source in memory and on disk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv::codegen {

/// SPIR-V words of a GLSL compute shader. Throws BackendError with the compiler's message.
/// Results are cached in memory and, unless QKV_NO_SHADER_CACHE is set, under
/// $XDG_CACHE_HOME/qkv (or ~/.cache/qkv), keyed by a hash of the source and compiler settings.
std::vector<std::uint32_t> compile_spirv(const std::string& name, const std::string& glsl);

/// 64-bit FNV-1a hash, as used for cache keys.
std::uint64_t content_hash(const std::string& text);

}  // namespace qkv::codegen
