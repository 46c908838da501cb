// Position information for attention: sinusoidal encodings, learned position embeddings, rotary
// embeddings (RoPE, both conventions) and ALiBi biases, built from iota, sin, cos and slices.
#pragma once

#include <bit>
#include <cmath>

#include "dsl/ops.hpp"

namespace qkv::dsl {

namespace detail {
template <Expr X> constexpr void require_even_static_last() {
  static_assert(X::shape.rank >= 2, "qkv: positions need [..., length, dim]");
  static_assert(!ir::is_symbol(X::shape.back(0)) && X::shape.back(0) % 2 == 0, "qkv: the model dim must be static and even");
}
/// A [N, C] tensor computed from x [..., N, D] (C <= D, static): a grid for iota that keeps x,
/// and so the inputs that bind its dims, in the graph. Its values are never used.
template <std::int64_t C, Expr X> constexpr auto grid_of(X x) {
  auto s = slice<-1, 0, C>(x);
  if constexpr (X::shape.rank == 2) return s;
  else return grid_of<C>(max<0, false>(s));
}
}  // namespace detail

/// The sinusoidal encoding of "Attention Is All You Need" for x [..., N, D]: [N, D] with
/// PE[p, 2i] = sin(p / base^(2i/D)) and PE[p, 2i+1] = cos(p / base^(2i/D)).
/// \code
///   auto x = input<"x">(dim<"B">, dim<"N">, dim<64>);
///   auto y = x + sinusoidal_positions(x);
/// \endcode
template <Expr X> constexpr auto sinusoidal_positions(X x, double base = 10000.0) {
  detail::require_even_static_last<X>();
  constexpr std::int64_t d = X::shape.back(0), half = d / 2;
  auto z = detail::grid_of<half>(x);  // [N, D/2]
  // angle[p, i] = p * base^(-2i/D)
  auto angle = iota<0>(z) * exp(iota<1>(z) * (-2.0 * std::log(base) / static_cast<double>(d)));
  constexpr ir::Shape pairs{X::shape.back(1), half, 1};
  constexpr ir::Shape out{X::shape.back(1), d};
  return detail::reshape_to<out>(concat<-1>(detail::reshape_to<pairs>(sin(angle)), detail::reshape_to<pairs>(cos(angle))));
}

/// Token (or position) embeddings: table[ids] for i32 ids [...] and a table [V, D], as
/// torch.nn.Embedding: the embedding op, a gather of rows (its gradient one_hot(ids)^T dy).
/// \code
///   auto ids = input<"ids", DType::i32>(dim<"B">, dim<"N">);
///   auto e = embedding(ids, input<"wte">(dim<100>, dim<32>));  // [B, N, 32]
/// \endcode
template <Expr Ids, Expr Table> constexpr auto embedding(Ids ids, Table table) {
  static_assert(Ids::dtype == DType::i32, "qkv: embedding ids are i32");
  return make_node<ir::Op::embedding>(ids, table);
}

/// Learned absolute positions: x + table[position_ids], table [max_len, D], position ids i32
/// [N] (or [B, N]), as GPT-2's wpe with position_ids.
/// \code
///   auto tokens = embedding(input<"ids", DType::i32>(dim<"B">, dim<"N">), input<"wte">(dim<50>, dim<32>));
///   auto x = learned_positions(tokens, input<"pos", DType::i32>(dim<"N">), input<"wpe">(dim<64>, dim<32>));
/// \endcode
template <Expr X, Expr P, Expr Table> constexpr auto learned_positions(X x, P position_ids, Table table) {
  return x + embedding(position_ids, table);
}

/// The two layouts of rotary embeddings: GPT-NeoX/Llama (HF) rotate the two halves of the head
/// dim; GPT-J/Meta's original Llama rotate interleaved pairs (2i, 2i+1).
enum class RopeStyle { half_split, interleaved };

namespace detail {
/// The template parameter object of D: a dim a builder derived, for a term to declare.
template <DimArg D> constexpr const DimArg* dim_object() { return &D; }

/// rotary_at over a named head dim D: the pairs come from a reshape to [..., N, 2, D/2]
/// (half-split) or [..., N, D/2, 2] (interleaved), so D must be even when bound, and the
/// frequencies' base^(-2i/D) take 1/D from a constant resolved when D is bound (1/sqrt(D*D)).
template <RopeStyle Style, Expr X, Expr P> auto rotary_named(X x, P positions, double base) {
  constexpr ir::Dim d = X::shape.back(0);
  constexpr bool split = Style == RopeStyle::half_split;
  constexpr DimArg half = DimArg::derived(ir::DimOp::quotient, d, 2);
  constexpr DimArg squared = DimArg::derived(ir::DimOp::product, d, d);
  constexpr ir::Dim h = half.value;
  constexpr ir::Shape pairs = [] {
    ir::Shape r;
    for (int i = 0; i + 1 < X::shape.rank; ++i) r.push_back(X::shape[i]);
    r.push_back(split ? 2 : h);
    r.push_back(split ? h : 2);
    return r;
  }();
  constexpr int pair_axis = split ? -2 : -1;
  auto xp = reshape_to<pairs, DimList<half>>(x);
  auto xa = slice<pair_axis, 0, 1>(xp);  // [..., N, 1, D/2] or [..., N, D/2, 1]
  auto xb = slice<pair_axis, 1, 2>(xp);
  // A [1, 1, D/2] (or [1, D/2, 1]) grid from xa for the frequencies' index i.
  auto to_rank3 = [](auto self, auto t) {
    if constexpr (decltype(t)::shape.rank == 3) return t;
    else return self(self, max<0, false>(t));
  };
  auto grid = max<0, true>(to_rank3(to_rank3, xa));
  Constant<> minus_two_log_base_over_d{{}, -2.0 * std::log(base), squared.value, dim_object<squared>()};
  auto inv_freq = exp(iota < split ? 2 : 1 > (grid)*minus_two_log_base_over_d);
  constexpr ir::Shape column{X::shape.back(1), 1, 1};
  auto angle = reshape_to<column>(positions) * inv_freq;  // [N, 1, D/2] or [N, D/2, 1]
  auto c = cos(angle);
  auto s = sin(angle);
  return reshape_to<X::shape>(concat<pair_axis>(xa * c - xb * s, xb * c + xa * s));
}
}  // namespace detail

/// Rotary position embedding (Su et al., RoFormer) of x [..., N, D] at positions `pos` (f32
/// [N]): each pair (x_a, x_b) rotated by the angle pos * base^(-2i/D). Apply it to queries and
/// keys after the projections and before the scores.
/// \code
///   auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
///   auto pos = cast(input<"pos", DType::i32>(dim<"N">));  // position ids, e.g. after a KV cache
///   auto rq = rotary_at(q, pos);                           // rotary(q): positions 0..N-1
/// \endcode
template <RopeStyle Style = RopeStyle::half_split, Expr X, Expr P> constexpr auto rotary_at(X x, P positions, double base = 10000.0) {
  static_assert(X::shape.rank >= 2, "qkv: positions need [..., length, dim]");
  static_assert(P::shape.rank == 1 && P::dtype == DType::f32, "qkv: rotary positions are f32 [N]");
  constexpr ir::Dim d = X::shape.back(0);
  if constexpr (ir::is_symbol(d)) {
    return detail::rotary_named<Style>(x, positions, base);
  } else {
    detail::require_even_static_last<X>();
    constexpr std::int64_t half = d / 2;
    constexpr ir::Shape column{X::shape.back(1), 1};
    auto inv_freq = exp(iota<1>(zeros<ir::Shape{1, half}>()) * (-2.0 * std::log(base) / static_cast<double>(d)));
    auto angle = detail::reshape_to<column>(positions) * inv_freq;  // [N, half]
    auto c = cos(angle);
    auto s = sin(angle);
    if constexpr (Style == RopeStyle::half_split) {
      auto x1 = slice<-1, 0, half>(x);
      auto x2 = slice<-1, half, d>(x);
      return concat<-1>(x1 * c - x2 * s, x2 * c + x1 * s);
    } else {
      constexpr ir::Shape pairs = [] {
        ir::Shape r;
        for (int i = 0; i + 1 < X::shape.rank; ++i) r.push_back(X::shape[i]);
        r.push_back(half);
        r.push_back(2);
        return r;
      }();
      constexpr ir::Shape angle3{X::shape.back(1), half, 1};
      auto xp = detail::reshape_to<pairs>(x);
      auto xe = slice<-1, 0, 1>(xp);
      auto xo = slice<-1, 1, 2>(xp);
      auto c3 = detail::reshape_to<angle3>(c);
      auto s3 = detail::reshape_to<angle3>(s);
      return detail::reshape_to<X::shape>(concat<-1>(xe * c3 - xo * s3, xe * s3 + xo * c3));
    }
  }
}

/// Rotary embedding at positions 0..N-1.
template <RopeStyle Style = RopeStyle::half_split, Expr X> constexpr auto rotary(X x, double base = 10000.0) {
  constexpr ir::Shape n{X::shape.back(1)};
  return rotary_at<Style>(x, detail::reshape_to<n>(iota<0>(detail::grid_of<1>(x))), base);
}

/// ALiBi's slope of head h of H: 2^(-8(h+1)/H) when H is a power of two; otherwise the slopes of
/// the power of two n below H, then every other slope of 2n (Press et al., as BLOOM computes it).
/// alibi_bias computes the same on the device; this is its host-side definition.
inline double alibi_slope(std::int64_t h, std::int64_t heads) {
  const auto n = static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(heads)));
  if (h < n) return std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n));
  return std::exp2(-8.0 * static_cast<double>(2 * (h - n) + 1) / static_cast<double>(2 * n));
}

/// ALiBi (Press et al., "Train Short, Test Long") as an additive bias [H, 1, M] for the scores of
/// H heads over the M keys of k [..., H, M, Dh]: -slope_h * (M - 1 - j). For a query i at the
/// end of the keys (causal, bottom-right) this is -slope_h * (i - j), ALiBi's bias; for other
/// queries it differs from it by a constant per row, which softmax ignores.
/// \code
///   auto q = input<"q">(dim<"B">, dim<8>, dim<"N">, dim<16>);
///   auto k = input<"k">(dim<"B">, dim<8>, dim<"N">, dim<16>);
///   auto out = scaled_dot_product_attention(q, k, k, causal, alibi_bias<8>(k));
/// \endcode
template <std::int64_t H, Expr K> constexpr auto alibi_bias(K k) {
  static_assert(K::shape.rank >= 3 && K::shape.back(2) == H, "qkv: alibi_bias<H> takes keys [..., H, M, Dh]");
  // A [H, 1, M] grid from the keys: [..., H, M, 1] without the leading dims, then transposed.
  auto leading_dropped = [](auto self, auto t) {
    if constexpr (decltype(t)::shape.rank == 3) return t;
    else return self(self, max<0, false>(t));
  };
  auto z = transpose<1, 2>(leading_dropped(leading_dropped, slice<-1, 0, 1>(k)));
  auto h = iota<0>(z);
  auto j = iota<2>(z);
  // log2 slope per head, piecewise linear in h: a * (h + 1) below n, b * (2 (h - n) + 1) above.
  constexpr std::int64_t n = static_cast<std::int64_t>(std::bit_floor(static_cast<std::uint64_t>(H)));
  auto low = (h + 1.0) * (-8.0 / static_cast<double>(n));
  auto high = ((h - static_cast<double>(n)) * 2.0 + 1.0) * (-8.0 / static_cast<double>(2 * n));
  auto log2_slope = where(greater(static_cast<double>(n) - 0.5, h), low, high);
  auto slope = exp(log2_slope * 0.69314718055994531);
  return slope * (j - max<-1>(j));
}

}  // namespace qkv::dsl
