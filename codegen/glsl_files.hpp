// The GLSL code generation writes as it is, kept in codegen/glsl/ as files a GLSL reader (and
// editor) reads as GLSL, embedded at build time: whole kernels as .comp files, their parts as
// .glsl files. Placeholders ($NAME) are filled in by the generator that uses a file.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::codegen {

/// The text of codegen/glsl/<name>, as the build embedded it. QKV_ASSERT: a file that exists.
std::string_view glsl_file(std::string_view name);
/// The names of the files embedded, in codegen/glsl/'s order.
std::vector<std::string_view> glsl_file_names();

/// The values of a template's placeholders: ("NAME", text) for each $NAME.
using GlslValues = std::vector<std::pair<std::string, std::string>>;

/// `text` with each placeholder replaced by its value, in one pass from the left (a value is not
/// read for placeholders). A placeholder is $NAME, NAME the longest run of capitals, digits and
/// underscores after the $ (starting with a capital), or ${NAME} where text follows that would
/// continue it (`${OUT}4`). One alone on its line whose value is whole lines (empty, or ending in
/// a newline) stands for those lines: the line is replaced by them, or removed. QKV_ASSERT: every
/// placeholder has a value, and no name is given twice (values no placeholder names are allowed:
/// templates have optional parts).
std::string fill_glsl(std::string_view text, const GlslValues& values);

/// codegen/glsl/<name> filled by fill_glsl, its errors naming the file.
std::string glsl_template(std::string_view name, const GlslValues& values);

}  // namespace qkv::codegen
