// SPIR-V compilation and its content-addressed cache.
#include "codegen/spirv.hpp"

#include <shaderc/shaderc.hpp>

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

constexpr const char* kCompilerSettings = "shaderc vulkan1.1 O";

std::filesystem::path cache_dir() {
  if (std::getenv("QKV_NO_SHADER_CACHE")) return {};
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "qkv";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "qkv";
  return {};
}

std::vector<std::uint32_t> read_cached(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return {};
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty() || bytes.size() % 4) return {};
  std::vector<std::uint32_t> words(bytes.size() / 4);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return words[0] == 0x07230203u ? words : std::vector<std::uint32_t>{};
}

void write_cached(const std::filesystem::path& file, const std::vector<std::uint32_t>& words) {
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  if (ec) return;  // the disk cache is an optimisation; an unwritable one is skipped
  auto tmp = file;
  tmp += ".tmp" + std::to_string(std::rand());
  {
    std::ofstream out(tmp, std::ios::binary);
    if (!out) return;
    out.write(reinterpret_cast<const char*>(words.data()), static_cast<std::streamsize>(words.size() * 4));
  }
  std::filesystem::rename(tmp, file, ec);
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

std::vector<std::uint32_t> compile_spirv(const std::string& name, const std::string& glsl) {
  static std::mutex mutex;
  static std::map<std::uint64_t, std::vector<std::uint32_t>> memory;
  const std::uint64_t key = content_hash(std::string(kCompilerSettings) + "\n" + glsl);
  std::lock_guard lock(mutex);
  if (auto it = memory.find(key); it != memory.end()) return it->second;

  std::filesystem::path file;
  if (auto dir = cache_dir(); !dir.empty()) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
    file = dir / (std::string(hex) + ".spv");
    if (auto words = read_cached(file); !words.empty()) return memory[key] = std::move(words);
  }

  shaderc::Compiler compiler;
  shaderc::CompileOptions options;
  options.SetTargetEnvironment(shaderc_target_env_vulkan, shaderc_env_version_vulkan_1_1);
  options.SetOptimizationLevel(shaderc_optimization_level_performance);
  auto result = compiler.CompileGlslToSpv(glsl, shaderc_compute_shader, name.c_str(), options);
  if (result.GetCompilationStatus() != shaderc_compilation_status_success)
    throw BackendError("shader " + name + " does not compile: " + result.GetErrorMessage());
  std::vector<std::uint32_t> words(result.cbegin(), result.cend());
  if (!file.empty()) write_cached(file, words);
  return memory[key] = std::move(words);
}

}  // namespace qkv::codegen
