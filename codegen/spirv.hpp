// GLSL to SPIR-V with libshaderc, cached by a hash of the source in memory and on disk.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qkv::codegen {

/// How much libshaderc optimises: `performance` runs spirv-opt's performance passes (the default:
/// a GPU driver's compiler may lean on them; lavapipe's LLVM runs as fast either way, sdpa at 512
/// and 1024 positions within noise); `none` skips them, which are most of a compile on the
/// host (the test suite's choice: its kernels run in microseconds, compiling them is the cost;
/// codegen's tests still compile every kernel with them).
enum class SpirvOptimization { none, performance };

/// SPIR-V words of a GLSL compute shader. Throws BackendError with the compiler's message.
/// Results are cached in memory and, unless QKV_NO_SHADER_CACHE is set, under
/// $XDG_CACHE_HOME/qkv (or ~/.cache/qkv), keyed by a hash of the source and compiler settings.
std::vector<std::uint32_t> compile_spirv(const std::string& name, const std::string& glsl,
                                         SpirvOptimization optimization = SpirvOptimization::performance);

/// Whether a module declares SPV_NV_cooperative_matrix's capability.
bool uses_nv_cooperative_matrix(const std::vector<std::uint32_t>& words);
/// The module with its SPV_NV_cooperative_matrix instructions rewritten as
/// SPV_KHR_cooperative_matrix's, for devices that offer only VK_KHR_cooperative_matrix (AMD,
/// Intel): Debian 12's glslang compiles only the NV extension. Each fragment type is declared
/// once per multiply-add operand (A, B, accumulator) its values feed; loads and stores take KHR's
/// layout operand (codegen/spirv_khr.cpp). Throws BackendError for what it does not rewrite.
std::vector<std::uint32_t> khr_cooperative_matrix(const std::vector<std::uint32_t>& nv);

/// 64-bit FNV-1a hash, as used for cache keys.
std::uint64_t content_hash(const std::string& text);

/// The disk cache's entries: a header (magic, key, word count, a checksum of the words) before
/// the SPIR-V. load_cached_spirv returns the words only when every part checks out (a truncated,
/// corrupted or foreign file gives nullopt, and compile_spirv then recompiles and rewrites it).
/// store_cached_spirv writes a temporary unique to this process and call, checks the write, and
/// renames it into place; it returns false (and leaves nothing) when it could not.
std::optional<std::vector<std::uint32_t>> load_cached_spirv(const std::filesystem::path& file, std::uint64_t key);
bool store_cached_spirv(const std::filesystem::path& file, std::uint64_t key, const std::vector<std::uint32_t>& words);

}  // namespace qkv::codegen
