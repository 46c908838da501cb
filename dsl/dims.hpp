// Compile-time dims and names: dim<64> is a static size, dim<"N"> a named dim bound at run time.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "ir/shape.hpp"

namespace qkv::dsl {

inline constexpr std::size_t kMaxNameLength = 31;

/// A string usable as a template argument: input<"q">, output names.
template <std::size_t N>
struct FixedString {
  std::array<char, N> chars{};
  constexpr FixedString() = default;
  constexpr FixedString(const char (&s)[N]) {
    for (std::size_t i = 0; i < N; ++i) chars[i] = s[i];
  }
  constexpr std::string_view view() const { return {chars.data(), N - 1}; }
};

/// "prefix" + ".name", or "name" when the prefix is empty: PyTorch's parameter paths
/// ("self_attn.in_proj_weight").
template <FixedString Prefix, FixedString Name>
constexpr auto param_path() {
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

/// A dim as a template argument: an integer size or a name.
struct DimArg {
  ir::Dim value = 0;
  std::array<char, kMaxNameLength + 1> name{};

  constexpr DimArg(long long size) : value(size) {}
  template <std::size_t N>
    requires(N - 1 <= kMaxNameLength)
  constexpr DimArg(const char (&s)[N]) : value(ir::symbol_id(std::string_view(s, N - 1))) {
    for (std::size_t i = 0; i + 1 < N; ++i) name[i] = s[i];
  }
  constexpr bool is_named() const { return ir::is_symbol(value); }
  constexpr std::string_view name_view() const {
    std::size_t n = 0;
    while (n < name.size() && name[n]) ++n;
    return {name.data(), n};
  }
};

/// The type of dim<D>; carries D.
template <DimArg D>
struct DimC {
  static constexpr DimArg arg = D;
};

/// dim<64>: a static size; dim<"N">: a dim named N, bound when the graph runs. Equal names in
/// different inputs are the same dim.
template <DimArg D>
inline constexpr DimC<D> dim{};

/// A list of dims, kept in expression types so that lowering can name their symbols.
template <DimArg... Ds>
struct DimList {
  static constexpr ir::Shape shape() {
    ir::Shape s;
    (s.push_back(Ds.value), ...);
    return s;
  }
};

}  // namespace qkv::dsl
