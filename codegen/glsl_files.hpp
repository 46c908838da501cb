// The GLSL code generation writes as it is, kept in codegen/glsl/ as files a GLSL reader (and
// editor) reads as GLSL, embedded at build time. Placeholders ($NAME) are filled in by the
// generator that uses a file.
#pragma once

#include <string_view>

namespace qkv::codegen {

/// The text of codegen/glsl/<name>, as the build embedded it. QKV_ASSERT: a file that exists.
std::string_view glsl_file(std::string_view name);

}  // namespace qkv::codegen
