// codegen/glsl/*.glsl, embedded by CMakeLists.txt into glsl_files.inc at configure time (each
// file a raw string literal; editing one reconfigures).
#include "codegen/glsl_files.hpp"

#include <string>
#include <utility>

#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

constexpr std::pair<std::string_view, std::string_view> kFiles[] = {
#include "codegen/glsl_files.inc"
};

}  // namespace

std::string_view glsl_file(std::string_view name) {
  for (const auto& [file, text] : kFiles)
    if (file == name) return text;
  QKV_UNREACHABLE("no GLSL file codegen/glsl/" + std::string(name));
}

}  // namespace qkv::codegen
