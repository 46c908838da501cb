// Compile-time dims and names: dim<64> is a static size, dim<"N"> a named dim bound at run time.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <utility>

#include "ir/shape.hpp"

namespace qkv::dsl {

/// The longest dim name, or text of a dim expression ("3*E"), a DimArg holds, in characters.
inline constexpr std::size_t kMaxNameLength = 31;

/// A string usable as a template argument: input<"q">, output names.
template <std::size_t N> struct FixedString {
  std::array<char, N> chars{};  ///< The characters and a terminating '\0' (N counts it).
  constexpr FixedString() = default;
  /// From a string literal (implicit, so that input<"q"> converts "q").
  constexpr FixedString(const char (&s)[N]) {
    for (std::size_t i = 0; i < N; ++i) chars[i] = s[i];
  }
  /// The string, without the terminating '\0'.
  constexpr std::string_view view() const { return {chars.data(), N - 1}; }
};

/// "prefix" + ".name", or "name" when the prefix is empty: PyTorch's parameter paths
/// ("self_attn.in_proj_weight").
template <FixedString Prefix, FixedString Name> constexpr auto param_path() {
  constexpr std::size_t p = Prefix.view().size(), n = Name.view().size();
  constexpr std::size_t size = p == 0 ? n : p + 1 + n;
  FixedString<size + 1> r;
  std::size_t k = 0;
  for (std::size_t i = 0; i < p; ++i) r.chars[k++] = Prefix.chars[i];
  if (p != 0) r.chars[k++] = '.';
  for (std::size_t i = 0; i < n; ++i) r.chars[k++] = Name.chars[i];
  r.chars[k] = '\0';
  return r;
}

/// A dim as a template argument: an integer size, a name, an expression of them (`3 * E`,
/// `E / H`: its text is its name, "3*E"), or a dim a builder derived from two others' values
/// (`derived(DimOp::quotient, e, h)`, declared to the graph from their symbols).
struct DimArg {
  /// The size, or (negative) the symbol: ir::symbol_id of a name, ir::derived_dim of an
  /// expression's or derived()'s operands.
  ir::Dim value = 0;
  /// The name or the expression's text ("3*E"), '\0'-padded; empty for a size or a derived() dim.
  std::array<char, kMaxNameLength + 1> name{};
  ir::DimOp op = ir::DimOp::sum;  ///< derived(): how `a` and `b` make the value.
  ir::Dim a = 0;                  ///< derived(): the first operand's dim (0 otherwise).
  ir::Dim b = 0;                  ///< derived(): the second operand's dim (0 otherwise).

  /// A static size: dim<64>.
  constexpr DimArg(long long size) : value(size) {}
  /// A dim named by a string literal of at most kMaxNameLength characters: dim<"N">.
  template <std::size_t N>
  requires(N - 1 <= kMaxNameLength) constexpr DimArg(const char (&s)[N]) : value(ir::symbol_id(std::string_view(s, N - 1))) {
    for (std::size_t i = 0; i + 1 < N; ++i) name[i] = s[i];
  }
  /// The dim `a op b` of two dims' values; a size when both are (a quotient must be exact).
  static constexpr DimArg derived(ir::DimOp op, ir::Dim a, ir::Dim b) {
    if (op == ir::DimOp::quotient && !ir::is_symbol(a) && !ir::is_symbol(b) && (b == 0 || a % b != 0))
      throw "qkv: a quotient of static dims must be a whole size";
    DimArg r(ir::derived_dim(op, a, b));
    if (ir::is_symbol(r.value) && r.value != a && r.value != b) {
      r.op = op;
      r.a = a;
      r.b = b;
    }
    return r;
  }
  /// Whether the dim is a symbol (a name, an expression of one, or derived from one), not a size.
  constexpr bool is_named() const { return ir::is_symbol(value); }
  /// The name or expression text; empty for a size or a derived() dim.
  constexpr std::string_view name_view() const {
    std::size_t n = 0;
    while (n < name.size() && name[n]) ++n;
    return {name.data(), n};
  }
  /// Whether the graph learns this dim from its parts (derived(), not a name or an expression).
  constexpr bool is_derived_by_value() const { return is_named() && name[0] == '\0' && (a != 0 || b != 0); }
};

namespace detail {
/// `a op b` of two template dims: a size when both are, else an expression named by its text.
constexpr DimArg combine_dims(ir::DimOp op, char sign, const DimArg& a, const DimArg& b) {
  if (!a.is_named() && !b.is_named()) return DimArg::derived(op, a.value, b.value);
  std::array<char, 2 * (kMaxNameLength + 3) + 2> text{};
  std::size_t n = 0;
  auto put = [&](const DimArg& d) {
    if (d.is_named() && d.name[0] == '\0') throw "qkv: only sizes, names and their expressions combine in a dim argument";
    std::string_view v = d.name_view();
    char digits[24]{};
    if (!d.is_named()) {  // a size, in decimal
      std::int64_t x = d.value;
      int k = 0;
      do digits[k++] = static_cast<char>('0' + x % 10);
      while ((x /= 10) != 0);
      for (int i = 0; i < k / 2; ++i) std::swap(digits[i], digits[k - 1 - i]);
      v = std::string_view(digits, static_cast<std::size_t>(k));
    }
    const bool composite = v.find_first_of("+*/") != std::string_view::npos;
    if (composite) text[n++] = '(';
    for (char c : v) text[n++] = c;
    if (composite) text[n++] = ')';
  };
  put(a);
  text[n++] = sign;
  put(b);
  if (n > kMaxNameLength) throw "qkv: a dim expression's text is longer than 31 characters";
  DimArg r(ir::derived_dim(op, a.value, b.value));
  for (std::size_t i = 0; i < n; ++i) r.name[i] = text[i];
  return r;
}
}  // namespace detail

/// The dim a + b, for shapes and sizes (dim<N + M>): a size when both are, else a symbol named by
/// its text ("N+M").
constexpr DimArg operator+(const DimArg& a, const DimArg& b) { return detail::combine_dims(ir::DimOp::sum, '+', a, b); }
/// The dim a * b (dim<3 * E>): a size when both are, else a symbol named by its text ("3*E").
constexpr DimArg operator*(const DimArg& a, const DimArg& b) { return detail::combine_dims(ir::DimOp::product, '*', a, b); }
/// The dim a / b (dim<E / H>): a size when both are (a compile error unless b divides a), else a
/// symbol named by its text ("E/H"), whose division is checked when the graph is bound.
constexpr DimArg operator/(const DimArg& a, const DimArg& b) { return detail::combine_dims(ir::DimOp::quotient, '/', a, b); }

/// The type of dim<D>; carries D.
template <DimArg D> struct DimC {
  static constexpr DimArg arg = D;  ///< The dim D.
};

/// dim<64>: a static size; dim<"N">: a dim named N, bound when the graph runs. Equal names in
/// different inputs are the same dim.
template <DimArg D> inline constexpr DimC<D> dim{};

/// A list of dims, kept in expression types so that lowering can name their symbols.
template <DimArg... Ds> struct DimList {
  /// The shape of the dims: each one's size or symbol.
  static constexpr ir::Shape shape() {
    ir::Shape s;
    (s.push_back(Ds.value), ...);
    return s;
  }
};

}  // namespace qkv::dsl
