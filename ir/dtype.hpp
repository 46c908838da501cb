// Element types of tensors and graph values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace qkv {

/// Element type. f32 is the type of every float graph value; f64 exists inside the reference
/// backend and in host tensors; boolean masks are stored one byte per element on the host; i32
/// holds token ids and class targets (graph inputs only).
enum class DType : std::uint8_t { f32, f64, boolean, i32 };

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::boolean: return "bool";
    case DType::i32: return "i32";
  }
  return "?";
}

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::boolean: return 1;
    case DType::i32: return 4;
  }
  return 0;
}

constexpr bool is_float(DType t) { return t == DType::f32 || t == DType::f64; }

constexpr std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "f32") return DType::f32;
  if (s == "f64") return DType::f64;
  if (s == "bool") return DType::boolean;
  if (s == "i32") return DType::i32;
  return std::nullopt;
}

}  // namespace qkv
