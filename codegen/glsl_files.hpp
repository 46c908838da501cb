// The GLSL code generation writes as it is, kept in codegen/glsl/ as files a GLSL reader (and
// editor) reads as GLSL, embedded at build time. Placeholders ($NAME) are filled in by the
// generator that uses a file.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::codegen {

/// The text of codegen/glsl/<name>, as the build embedded it. QKV_ASSERT: a file that exists.
std::string_view glsl_file(std::string_view name);

/// The values of a template's placeholders: ("NAME", text) for each $NAME.
using GlslValues = std::vector<std::pair<std::string, std::string>>;

/// `text` with each $NAME of `values` replaced by its text, longer names first (so $AT is not $A
/// then T). A placeholder alone on its line whose text is whole lines (empty, or ending in a
/// newline) stands for those lines: the line is replaced by them, or removed.
std::string fill_glsl(std::string text, GlslValues values);

/// codegen/glsl/<name> filled by fill_glsl. QKV_ASSERT: every $NAME of the file has a value.
std::string glsl_template(std::string_view name, GlslValues values);

}  // namespace qkv::codegen
