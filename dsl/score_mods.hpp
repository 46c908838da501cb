// Score and mask modifiers written as ordinary expressions, as PyTorch's FlexAttention writes
// them: score_mod(f) with f(score, b, h, q_idx, kv_idx) and mask_mod(f) with f(b, h, q_idx,
// kv_idx). The indices are expressions over the scores' axes and subscripts for tensors laid out
// along them (slope[h], doc[q_idx], at(doc, b, q_idx)); what f returns is checked against the
// scores' shape where attention is called, and fusion turns it into flex attention's region.
#pragma once

#include <limits>
#include <type_traits>
#include <utility>

#include "dsl/ops.hpp"

namespace qkv::dsl {

/// The index of a score along one of its axes, counted from the end (0: the key kv_idx, 1: the
/// query q_idx, 2: the head h, 3: the batch entry b), of size `Size`: an f32 expression (0, 1, 2,
/// ... along that axis, broadcasting along the others) computed from q's and k's shapes only,
/// and a subscript for tensors laid out along that axis.
template <int FromEnd, ir::Dim Size, Expr Grid> struct ScoreIndex : decltype(iota<Grid::shape.rank - 1 - FromEnd>(std::declval<Grid>())) {
  static constexpr int from_end = FromEnd;  ///< The axis, counted from the end of the scores' dims.
  static constexpr ir::Dim size = Size;     ///< The axis' size (a size or a symbol).
};

/// What a modifier gets for an axis the scores do not have (b of scores [N, M] or [B, N, M]).
struct NoScoreIndex {};

namespace detail {
template <class T> struct is_score_index : std::false_type {};
template <int F, ir::Dim S, class G> struct is_score_index<ScoreIndex<F, S, G>> : std::true_type {};
/// b, h, q_idx or kv_idx, as a modifier gets them.
template <class T>
concept AScoreIndex = is_score_index<T>::value;

template <int FromEnd, ir::Dim Size, Expr Grid> constexpr auto score_index(Grid grid) {
  return ScoreIndex<FromEnd, Size, Grid>{iota<Grid::shape.rank - 1 - FromEnd>(grid)};
}

/// x [d0, ..., dk] with each dim at its index's axis of the scores, 1 elsewhere: the shape
/// x[i0, ..., ik] broadcasts from.
template <Expr X, class... I> constexpr ir::Shape subscript_shape() {
  constexpr int from_end[] = {I::from_end...};
  ir::Shape s;
  for (int a = from_end[0]; a >= 0; --a) s.push_back(1);
  for (int k = 0; k < static_cast<int>(sizeof...(I)); ++k) s[s.rank - 1 - from_end[k]] = X::shape[k];
  return s;
}

template <Expr X, class... I> constexpr bool subscripts_fit() {
  constexpr int from_end[] = {I::from_end...};
  constexpr ir::Dim sizes[] = {I::size...};
  for (int k = 0; k < static_cast<int>(sizeof...(I)); ++k) {
    if (k > 0 && from_end[k] >= from_end[k - 1]) return false;
    if (X::shape[k] != 1 && !ir::dims_compatible(X::shape[k], sizes[k])) return false;
  }
  return true;
}
}  // namespace detail

/// x[i0, ..., ik] for the indices a modifier gets, one per dim of x, in the scores' axis order:
/// at(slopes, h) for slopes [H], at(doc, b, q_idx) for doc ids [B, N]. Each dim of x is that
/// axis' size (or 1). An i32 tensor is read as f32, so ids compare: at(doc, b, q_idx) ==
/// at(doc, b, kv_idx). Nothing is gathered: x is laid out along the scores' axes and broadcasts.
template <Expr X, detail::AScoreIndex... I> constexpr auto at(X x, I...) {
  static_assert(sizeof...(I) > 0, "qkv: at(x, i...) takes one index per dim of x");
  static_assert(sizeof...(I) == X::shape.rank, "qkv: at(x, i...) takes one index per dim of x");
  static_assert(detail::subscripts_fit<X, I...>(),
                "qkv: at(x, i...): give the indices in the scores' order (b, h, q_idx, kv_idx), each dim of x that axis' size");
  auto laid_out = detail::reshape_to<detail::subscript_shape<X, I...>()>(x);
  if constexpr (X::dtype == DType::i32) return cast(laid_out);
  else return laid_out;
}

/// Option: a score modifier f(score, b, h, q_idx, kv_idx), as FlexAttention's score_mod: it gets
/// the scaled scores and the indices and returns the modified scores, an f32 expression of the
/// scores' shape. Modifiers apply in the order given, with additive biases, after soft-capping
/// and before masks. Example: ALiBi with per-head slopes, soft-capped first.
/// \code
///   auto q = input<"q">(dim<"B">, dim<8>, dim<"N">, dim<64>);
///   auto slope = input<"slope">(dim<8>);
///   auto out = scaled_dot_product_attention(q, q, q, causal, score_mod([=](auto score, auto, auto h, auto q_idx, auto kv_idx) {
///     return softcap(score, 30) + slope[h] * (kv_idx - q_idx);
///   }));
/// \endcode
template <class F> struct ScoreMod {
  F f;  ///< The modifier, f(score, b, h, q_idx, kv_idx).
};
/// The option ScoreMod{f}: the scaled scores become f(score, b, h, q_idx, kv_idx).
template <class F> constexpr ScoreMod<F> score_mod(F f) { return {f}; }

/// Option: a mask modifier f(b, h, q_idx, kv_idx), as FlexAttention's mask_mod: a boolean
/// expression broadcasting to the scores, true where query q_idx keeps key kv_idx. Example:
/// document masking for packed sequences.
/// \code
///   auto q = input<"q">(dim<"B">, dim<8>, dim<"N">, dim<64>);
///   auto doc = input<"doc", DType::i32>(dim<"B">, dim<"N">);
///   auto out = scaled_dot_product_attention(q, q, q, mask_mod([=](auto b, auto, auto q_idx, auto kv_idx) {
///     return at(doc, b, q_idx) == at(doc, b, kv_idx) && q_idx >= kv_idx;
///   }));
/// \endcode
template <class F> struct MaskMod {
  F f;  ///< The modifier, f(b, h, q_idx, kv_idx).
};
/// The option MaskMod{f}: a key is dropped where f(b, h, q_idx, kv_idx) is false.
template <class F> constexpr MaskMod<F> mask_mod(F f) { return {f}; }

namespace detail {
template <class T> struct is_score_mod : std::false_type {};
template <class F> struct is_score_mod<ScoreMod<F>> : std::true_type {};
template <class T> struct is_mask_mod : std::false_type {};
template <class F> struct is_mask_mod<MaskMod<F>> : std::true_type {};

/// The indices of scores q kT for q [..., N, D] and k [..., M, D], built from q's and k's shapes
/// (never from the scores: unfused they cost O((N + M) D), and fusion reads them as positions).
template <Expr Q, Expr K> struct ScoreIndices {
  Q q;
  K k;
  static constexpr bool varlen = false;
  static constexpr int rank = decltype(matmul<false, true>(std::declval<Q>(), std::declval<K>()))::shape.rank;

  // Grids for iota (their values are never read): reductions over the head dim, which may be named.
  constexpr auto query_column() const { return max<-1>(q); }                // [..., N, 1]
  constexpr auto key_row() const { return transpose<-2, -1>(max<-1>(k)); }  // [..., 1, M]
  constexpr auto q_idx() const { return score_index<1, Q::shape.back(1)>(query_column()); }
  constexpr auto kv_idx() const { return score_index<0, K::shape.back(1)>(key_row()); }
  /// Index `FromEnd` over the scores' batch dims: a [..., 1, 1] grid from q's and k's.
  template <int FromEnd> constexpr auto batch_index() const {
    if constexpr (rank <= FromEnd) {
      return NoScoreIndex{};
    } else {
      auto grid = max<-2>(query_column()) + max<-1>(key_row());  // [..., 1, 1]
      return score_index<FromEnd, decltype(grid)::shape.back(FromEnd)>(grid);
    }
  }
  /// b and h: with scores [B, H, N, M] (or more dims) the 4th and 3rd axes from the end; with
  /// [B, N, M], b is the first and there is no h.
  constexpr auto b() const { return batch_index < rank == 3 ? 2 : 3 > (); }
  constexpr auto h() const {
    if constexpr (rank == 3) return NoScoreIndex{};
    else return batch_index<2>();
  }
};

/// The scores through score_mod f: what f returns, broadcast to the scores' shape.
template <class S, class F, class Ix> constexpr auto apply_score_mod(S scores, const ScoreMod<F>& m, const Ix& ix) {
  auto r = m.f(scores, ix.b(), ix.h(), ix.q_idx(), ix.kv_idx());
  using R = decltype(r);
  static_assert(Expr<R> && R::dtype == DType::f32, "qkv: a score_mod returns an f32 expression (the modified score)");
  static_assert(decltype(scores + r)::shape == S::shape, "qkv: a score_mod's result must broadcast to the scores' shape");
  if constexpr (R::shape == S::shape) return r;
  else return make_node<ir::Op::broadcast_to, shape_attrs(S::shape)>(r);
}

/// The scores with the keys mask_mod f drops at -inf.
template <class S, class F, class Ix> constexpr auto apply_mask_mod(S scores, const MaskMod<F>& m, const Ix& ix) {
  auto keep = m.f(ix.b(), ix.h(), ix.q_idx(), ix.kv_idx());
  using M = decltype(keep);
  static_assert(Expr<M> && M::dtype == DType::boolean, "qkv: a mask_mod returns a boolean expression (true keeps the key)");
  static_assert(decltype(where(keep, scores, 0.0))::shape == S::shape, "qkv: a mask_mod's result must broadcast to the scores' shape");
  return where(keep, scores, kNegInf);
}
}  // namespace detail

}  // namespace qkv::dsl
