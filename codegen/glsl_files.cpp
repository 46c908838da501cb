// codegen/glsl/*.comp and *.glsl, embedded by CMakeLists.txt into glsl_files.inc at configure
// time (each file a raw string literal; editing one reconfigures), and how they are filled.
#include "codegen/glsl_files.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "ir/error.hpp"

namespace qkv::codegen {

namespace {

constexpr std::pair<std::string_view, std::string_view> kFiles[] = {
#include "codegen/glsl_files.inc"
};

}  // namespace

std::vector<std::string_view> glsl_file_names() {
  std::vector<std::string_view> names;
  for (const auto& file : kFiles) names.push_back(file.first);
  return names;
}

std::string_view glsl_file(std::string_view name) {
  for (const auto& [file, text] : kFiles)
    if (file == name) return text;
  QKV_UNREACHABLE("no GLSL file codegen/glsl/" + std::string(name));
}

namespace {

bool name_char(char c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

/// `text` filled in one pass from the left (values are never read for placeholders); `where`
/// names the template in errors.
std::string fill(std::string_view text, const GlslValues& values, std::string_view where) {
  for (std::size_t i = 0; i < values.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) QKV_ASSERT(values[i].first != values[j].first, std::string(where) + ": $" + values[i].first + " given twice");
  std::string out;
  std::size_t at = 0;
  for (std::size_t d = text.find('$'); d != std::string_view::npos; d = text.find('$', at)) {
    out += text.substr(at, d - at);
    // $NAME (the longest run of capitals, digits and underscores) or ${NAME}.
    const bool braced = d + 1 < text.size() && text[d + 1] == '{';
    const std::size_t first = d + (braced ? 2 : 1);
    std::size_t last = first;
    while (last < text.size() && name_char(text[last])) ++last;
    if (last == first || !(text[first] >= 'A' && text[first] <= 'Z')) {  // not a placeholder
      out += '$';
      at = d + 1;
      continue;
    }
    const std::string_view name = text.substr(first, last - first);
    if (braced) {
      QKV_ASSERT(last < text.size() && text[last] == '}', std::string(where) + ": ${" + std::string(name) + " is not closed");
      ++last;
    }
    const auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == name; });
    QKV_ASSERT(it != values.end(), std::string(where) + ": no value for $" + std::string(name));
    const std::string& value = it->second;
    // Alone on its line with whole lines for a value: those lines replace the line.
    const bool alone = (d == 0 || text[d - 1] == '\n') && last < text.size() && text[last] == '\n';
    const bool lines = value.empty() || value.back() == '\n';
    out += value;
    at = last + (alone && lines ? 1 : 0);
  }
  out += text.substr(std::min(at, text.size()));
  return out;
}

}  // namespace

std::string fill_glsl(std::string_view text, const GlslValues& values) { return fill(text, values, "GLSL template"); }

std::string glsl_template(std::string_view name, const GlslValues& values) {
  return fill(glsl_file(name), values, "codegen/glsl/" + std::string(name));
}

}  // namespace qkv::codegen
