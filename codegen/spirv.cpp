// SPIR-V compilation and its content-addressed cache.
#include "codegen/spirv.hpp"

#include <shaderc/shaderc.hpp>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

std::filesystem::path cache_dir() {
  if (std::getenv("QKV_NO_SHADER_CACHE")) return {};
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "qkv";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "qkv";
  return {};
}

}  // namespace

std::uint64_t content_hash(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

constexpr char kCacheMagic[8] = {'Q', 'K', 'V', 'S', 'P', 'V', '1', '\0'};

struct CacheHeader {
  char magic[8];
  std::uint64_t key;
  std::uint64_t words;
  std::uint64_t checksum;
};

std::uint64_t checksum_of(const std::vector<std::uint32_t>& words) {
  return content_hash(std::string(reinterpret_cast<const char*>(words.data()), words.size() * 4));
}

}  // namespace

std::optional<std::vector<std::uint32_t>> load_cached_spirv(const std::filesystem::path& file, std::uint64_t key) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  CacheHeader h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof h) || std::memcmp(h.magic, kCacheMagic, sizeof kCacheMagic) != 0 || h.key != key || h.words == 0 ||
      h.words > (std::uint64_t{1} << 24))
    return std::nullopt;
  std::vector<std::uint32_t> words(static_cast<std::size_t>(h.words));
  if (!in.read(reinterpret_cast<char*>(words.data()), static_cast<std::streamsize>(words.size() * 4)) || in.peek() != EOF) return std::nullopt;
  if (words[0] != 0x07230203u || checksum_of(words) != h.checksum) return std::nullopt;
  return words;
}

bool store_cached_spirv(const std::filesystem::path& file, std::uint64_t key, const std::vector<std::uint32_t>& words) {
  static std::atomic<unsigned> counter{0};
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) return false;
  auto tmp = file;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  CacheHeader h{};
  std::memcpy(h.magic, kCacheMagic, sizeof kCacheMagic);
  h.key = key;
  h.words = words.size();
  h.checksum = checksum_of(words);
  bool ok = false;
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    out.write(reinterpret_cast<const char*>(words.data()), static_cast<std::streamsize>(words.size() * 4));
    out.close();
    ok = !out.fail();
  }
  if (ok) std::filesystem::rename(tmp, file, ec);
  if (!ok || ec) {
    std::filesystem::remove(tmp, ec);
    return false;
  }
  return true;
}

std::vector<std::uint32_t> compile_spirv(const std::string& name, const std::string& glsl, SpirvOptimization optimization) {
  static std::mutex mutex;
  static std::map<std::uint64_t, std::vector<std::uint32_t>> memory;
  const bool optimize = optimization == SpirvOptimization::performance;
  const std::uint64_t key = content_hash(std::string("shaderc vulkan1.1 ") + (optimize ? "O" : "O0") + "\n" + glsl);
  std::lock_guard lock(mutex);
  if (auto it = memory.find(key); it != memory.end()) return it->second;

  std::filesystem::path file;
  if (auto dir = cache_dir(); !dir.empty()) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
    file = dir / (std::string(hex) + ".qkvspv");
    if (auto words = load_cached_spirv(file, key)) return memory[key] = std::move(*words);
  }

  shaderc::Compiler compiler;
  shaderc::CompileOptions options;
  options.SetTargetEnvironment(shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_1);
  options.SetOptimizationLevel(optimize ? shaderc_optimization_level_performance : shaderc_optimization_level_zero);
  auto result = compiler.CompileGlslToSpv(glsl, shaderc_compute_shader, name.c_str(), options);
  if (result.GetCompilationStatus() != shaderc_compilation_status_success)
    throw BackendError("shader " + name + " does not compile: " + result.GetErrorMessage());
  std::vector<std::uint32_t> words(result.cbegin(), result.cend());
  if (!file.empty()) store_cached_spirv(file, key, words);  // the disk cache is an optimisation: a failed write is skipped
  return memory[key] = std::move(words);
}

}  // namespace qkv::codegen
