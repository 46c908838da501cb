// Dims and shapes usable in constant expressions: the DSL checks shapes at compile time and the
// graph checks them at run time with the same code.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string_view>

namespace qkv::ir {

/// A dim: a size >= 0, or a symbol (< 0) bound when a graph runs. Symbols are derived from
/// their names by `symbol_id`, so the same name always means the same symbol.
using Dim = std::int64_t;

/// The largest rank a shape may have.
inline constexpr int kMaxRank = 8;

/// Whether `d` is a symbol (a named or derived dim) rather than a size.
constexpr bool is_symbol(Dim d) { return d < 0; }

/// The symbol id of a dim name (FNV-1a, mapped to the negative numbers).
constexpr Dim symbol_id(std::string_view name) {
  std::uint32_t h = 2166136261u;
  for (char c : name) {
    h ^= static_cast<std::uint8_t>(c);
    h *= 16777619u;
  }
  return -static_cast<Dim>(h) - 1;
}

/// How a derived dim is made of two others: concat sums dims, splitting into heads divides one
/// (E/H), joining heads multiplies (H*Dh).
enum class DimOp : std::uint8_t { sum, product, quotient };

/// The dim `a op b`: a size when both are (a quotient of sizes truncates: whoever makes one checks
/// that it is exact); otherwise a symbol derived from the op and both dims, distinct from every
/// named symbol. Graphs name it ("A+B", "3*E", "E/4") and bind it from its parts. Multiplying or
/// dividing by 1 gives the dim itself.
constexpr Dim derived_dim(DimOp op, Dim a, Dim b) {
  if (op != DimOp::sum && b == 1) return a;
  if (op == DimOp::product && a == 1) return b;
  if (!is_symbol(a) && !is_symbol(b)) {
    switch (op) {
      case DimOp::sum: return a + b;
      case DimOp::product: return a * b;
      case DimOp::quotient: return b == 0 ? 0 : a / b;
    }
  }
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t byte) {
    h ^= byte;
    h *= 1099511628211ull;
  };
  if (op != DimOp::sum) mix(0x100u + static_cast<std::uint64_t>(op));  // sums keep the ids they always had
  for (Dim d : {a, b})
    for (int i = 0; i < 8; ++i) mix((static_cast<std::uint64_t>(d) >> (8 * i)) & 0xffu);
  return -(Dim{1} << 32) - static_cast<Dim>(h >> 33) - 1;
}

/// `a op b` of two sizes, or nothing when it has none: a quotient that is not whole, or a sum or
/// product past 63 bits. What binding and fixing sizes compute derived dims with.
constexpr std::optional<Dim> size_of(DimOp op, Dim a, Dim b) {
  Dim r = 0;
  switch (op) {
    case DimOp::sum: return __builtin_add_overflow(a, b, &r) ? std::nullopt : std::optional<Dim>(r);
    case DimOp::product: return __builtin_mul_overflow(a, b, &r) ? std::nullopt : std::optional<Dim>(r);
    case DimOp::quotient: return b == 0 || a % b != 0 ? std::nullopt : std::optional<Dim>(a / b);
  }
  return std::nullopt;
}

/// The dim a + b (what concat makes of two dims).
constexpr Dim sum_dims(Dim a, Dim b) { return derived_dim(DimOp::sum, a, b); }
/// The dim a * b.
constexpr Dim product_dims(Dim a, Dim b) { return derived_dim(DimOp::product, a, b); }
/// The dim a / b (exact where both are sizes; checked when a symbol is bound).
constexpr Dim quotient_dims(Dim a, Dim b) { return derived_dim(DimOp::quotient, a, b); }

/// A shape of rank <= kMaxRank. Structural, so it can be a template argument.
struct Shape {
  std::array<Dim, kMaxRank> dims{};  ///< the first `rank` are the dims; the rest stay 0
  int rank = 0;                      ///< how many dims

  constexpr Shape() = default;
  /// The dims given, in order (at most kMaxRank).
  constexpr Shape(std::initializer_list<Dim> ds) {
    for (Dim d : ds) dims[static_cast<std::size_t>(rank++)] = d;
  }
  /// Dim i, 0 <= i < rank (not checked).
  constexpr Dim operator[](int i) const { return dims[static_cast<std::size_t>(i)]; }
  /// Dim i, 0 <= i < rank (not checked), to change.
  constexpr Dim& operator[](int i) { return dims[static_cast<std::size_t>(i)]; }
  /// Appends a dim; the rank must stay <= kMaxRank (not checked).
  constexpr void push_back(Dim d) { dims[static_cast<std::size_t>(rank++)] = d; }
  /// Dim counted from the end: back(0) is the last dim.
  constexpr Dim back(int i = 0) const { return (*this)[rank - 1 - i]; }
  /// Whether every dim is a size (no symbol).
  constexpr bool is_static() const {
    for (int i = 0; i < rank; ++i)
      if (is_symbol((*this)[i])) return false;
    return true;
  }
  /// Product of the dims; only meaningful when is_static().
  constexpr std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= (*this)[i];
    return n;
  }
  /// Same rank and the same dims (symbols compare by id).
  friend constexpr bool operator==(const Shape& a, const Shape& b) {
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i)
      if (a[i] != b[i]) return false;
    return true;
  }
};

/// Whether two dims can be equal: static dims must match; a symbol matches anything until bound.
constexpr bool dims_compatible(Dim a, Dim b) { return a == b || is_symbol(a) || is_symbol(b); }

/// The more precise of two compatible dims (a static size beats a symbol).
constexpr Dim unify_dims(Dim a, Dim b) { return is_symbol(a) ? b : a; }

}  // namespace qkv::ir
