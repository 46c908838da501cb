// Element types of tensors and graph values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace qkv {

/// Element type. f32 is the type of float graph values; f16 and bf16 (ir/half.hpp) store floats
/// in half precision, computed in f32 and rounded as PyTorch does; f64 exists inside the
/// reference backend and in host tensors; boolean masks are stored one byte per element on the
/// host; i32 holds token ids and class targets (graph inputs only).
enum class DType : std::uint8_t { f32, f64, boolean, i32, f16, bf16 };

/// The dtype's name as the IR text and the command line write it: "f32", "bool", "bf16", ...
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::boolean: return "bool";
    case DType::i32: return "i32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

/// Bytes per element (a bool takes one byte).
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::boolean: return 1;
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
  }
  return 0;
}

/// A float type: f32, f64, or one of the half types.
constexpr bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16; }
/// f16 or bf16: stored in 16 bits; ops on them compute in f32 and round their result once.
constexpr bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

/// The dtype dtype_name gives `s`, or nullopt for any other text.
constexpr std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "f32") return DType::f32;
  if (s == "f64") return DType::f64;
  if (s == "bool") return DType::boolean;
  if (s == "i32") return DType::i32;
  if (s == "f16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  return std::nullopt;
}

}  // namespace qkv
