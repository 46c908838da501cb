// The fuzz targets: each takes arbitrary bytes, must never crash, hang or leak, and checks a
// property of what it parsed. Linked into the libFuzzer programs (tests/fuzz/*_main.cpp, built
// with clang by tests/fuzz/run.sh) and into the ordinary test that replays the corpora.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace qkv::fuzz {

/// io::parse_npy on the bytes; an array it accepts must survive format_npy -> parse_npy unchanged.
void npy(const std::uint8_t* data, std::size_t size);
/// io::parse_safetensors on the bytes; what it accepts must survive format_safetensors -> parse.
void safetensors(const std::uint8_t* data, std::size_t size);
/// ir::parse_graph on the bytes as text; a graph it accepts must print to text that parses to a
/// graph printing the same.
void ir_text(const std::uint8_t* data, std::size_t size);

/// The target called `name` ("npy", "safetensors", "ir_text"), or nullptr.
using Target = void (*)(const std::uint8_t*, std::size_t);
Target target(std::string_view name);

}  // namespace qkv::fuzz
