// codegen/glsl/*.glsl, embedded by CMakeLists.txt into glsl_files.inc at configure time (each
// file a raw string literal; editing one reconfigures).
#include "codegen/glsl_files.hpp"

#include <algorithm>
#include <cctype>
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

std::string fill_glsl(std::string text, GlslValues values) {
  std::sort(values.begin(), values.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [name, value] : values) {
    const std::string key = "$" + name;
    const bool lines = value.empty() || value.back() == '\n';
    for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size())) {
      const std::size_t end = at + key.size();
      const bool alone = (at == 0 || text[at - 1] == '\n') && end < text.size() && text[end] == '\n';
      text.replace(at, key.size() + (alone && lines ? 1 : 0), value);
    }
  }
  return text;
}

std::string glsl_template(std::string_view name, GlslValues values) {
  std::string text = fill_glsl(std::string(glsl_file(name)), std::move(values));
  for (std::size_t at = text.find('$'); at != std::string::npos; at = text.find('$', at + 1))
    QKV_ASSERT(at + 1 == text.size() || !std::isupper(static_cast<unsigned char>(text[at + 1])),
               "codegen/glsl/" + std::string(name) + ": no value for " +
                   text.substr(at, text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", at + 1) - at));
  return text;
}

}  // namespace qkv::codegen
