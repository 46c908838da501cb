// Multi-head and grouped-query attention, built from scaled dot-product attention by splitting
// the embedding into heads with reshapes and permutations.
#pragma once

#include "dsl/attention.hpp"
#include "dsl/layers.hpp"

namespace qkv::dsl {

namespace detail {
template <std::int64_t Parts, Expr X>
constexpr ir::Shape split_last(std::int64_t keep_front) {
  ir::Shape s;
  for (int i = 0; i < keep_front; ++i) s.push_back(X::shape[i]);
  s.push_back(Parts);
  s.push_back(X::shape.back(0) / Parts);
  return s;
}
}  // namespace detail

/// [B, L, H * Dh] -> [B, H, L, Dh]. H must divide the (static) last dim.
template <std::int64_t H, Expr X>
constexpr auto split_heads(X x) {
  constexpr ir::Dim e = X::shape.back(0);
  static_assert(X::shape.rank == 3, "qkv: split_heads takes [batch, length, embed]");
  static_assert(!ir::is_symbol(e), "qkv: the embedding dim must be static to split it into heads");
  static_assert(e % H == 0, "qkv: the embedding dim is not divisible by the number of heads");
  return permute<0, 2, 1, 3>(detail::reshape_to<detail::split_last<H, X>(2)>(x));
}

/// [B, H, L, Dh] -> [B, L, H * Dh].
template <Expr X>
constexpr auto merge_heads(X x) {
  static_assert(X::shape.rank == 4, "qkv: merge_heads takes [batch, heads, length, head dim]");
  using P = decltype(permute<0, 2, 1, 3>(x));
  constexpr ir::Shape s = [] {
    ir::Shape r;
    r.push_back(P::shape[0]);
    r.push_back(P::shape[1]);
    r.push_back(P::shape[2] * P::shape[3]);
    return r;
  }();
  return detail::reshape_to<s>(permute<0, 2, 1, 3>(x));
}

/// PyTorch's key_padding_mask (true: the key is padding and is ignored, the opposite of the
/// scaled dot-product convention) [B, M] as an additive bias [B, 1, 1, M] for per-head scores.
template <Expr K>
constexpr auto key_padding_bias(K key_padding_mask) {
  static_assert(K::dtype == DType::boolean && K::shape.rank == 2, "qkv: key_padding_mask is bool [batch, keys]");
  constexpr ir::Shape s{K::shape[0], 1, 1, K::shape[1]};
  return detail::reshape_to<s>(where(key_padding_mask, kNegInf, 0.0));
}

/// The result of multi-head attention: the output [B, N, E] and the weights per head
/// [B, H, N, M] (mean_over_heads gives torch's average_attn_weights=True).
template <class Out, class W>
struct HeadsResult {
  Out output;
  W weights;
};

/// Mean of per-head weights [B, H, N, M] over the heads: [B, N, M].
template <Expr W>
constexpr auto mean_over_heads(W w) { return mean<1, false>(w); }

/// Multi-head attention as torch.nn.MultiheadAttention(batch_first=True) computes it, with its
/// weights: query [B, N, E], key [B, M, Ek], value [B, M, Ev]; projections W [out, in] and
/// biases as in_proj_weight's three row blocks (or q/k/v_proj_weight) and out_proj. `opts` are
/// scaled_dot_product_attention's (masks broadcast over batch and heads; key_padding_bias for
/// key_padding_mask).
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<64>);
///   auto [out, w] = multi_head_attention<8>(x, x, x, wq, wk, wv, bq, bk, bv, wo, bo, causal);
/// \endcode
template <std::int64_t H, Expr Q, Expr K, Expr V, Expr Wq, Expr Wk, Expr Wv, Expr Bq, Expr Bk, Expr Bv, Expr Wo, Expr Bo, class... Opts>
constexpr auto multi_head_attention(Q query, K key, V value, Wq wq, Wk wk, Wv wv, Bq bq, Bk bk, Bv bv, Wo wo, Bo bo, Opts... opts) {
  auto q = split_heads<H>(linear(query, wq, bq));
  auto k = split_heads<H>(linear(key, wk, bk));
  auto v = split_heads<H>(linear(value, wv, bv));
  auto w = attention_weights(q, k, opts...);
  return HeadsResult<decltype(linear(merge_heads(matmul(w, v)), wo, bo)), decltype(w)>{linear(merge_heads(matmul(w, v)), wo, bo), w};
}

/// Grouped-query attention: H query heads share Hkv key/value heads (Hkv divides H; Hkv = 1 is
/// multi-query attention). q [B, N, H * Dh], k and v [B, M, Hkv * Dh], already projected; the
/// result is [B, N, H * Dh]. Query heads h * G .. h * G + G - 1 (G = H / Hkv) read key/value head
/// h, as in Llama's repeat_kv; nothing is copied: the batched matmul broadcasts the shared heads.
template <std::int64_t H, std::int64_t Hkv, Expr Q, Expr K, Expr V, class... Opts>
constexpr auto grouped_query_attention(Q q, K k, V v, Opts... opts) {
  static_assert(H % Hkv == 0, "qkv: the number of key/value heads must divide the number of query heads");
  constexpr std::int64_t G = H / Hkv;
  constexpr ir::Dim e = Q::shape.back(0);
  static_assert(!ir::is_symbol(e) && e % H == 0, "qkv: the query embedding must be static and divisible by the heads");
  constexpr std::int64_t dh = e / H;
  static_assert(K::shape.back(0) == Hkv * dh && V::shape.back(0) == Hkv * dh, "qkv: key/value embeddings must be Hkv * head dim");
  constexpr ir::Shape q5{Q::shape[0], Q::shape[1], Hkv, G, dh};
  constexpr ir::Shape k5{K::shape[0], K::shape[1], Hkv, 1, dh};
  // [B, N, Hkv, G, Dh] -> [B, Hkv, G, N, Dh]; keys and values [B, Hkv, 1, M, Dh] broadcast over G.
  auto qh = permute<0, 2, 3, 1, 4>(detail::reshape_to<q5>(q));
  auto kh = permute<0, 2, 3, 1, 4>(detail::reshape_to<k5>(k));
  auto vh = permute<0, 2, 3, 1, 4>(detail::reshape_to<k5>(v));
  auto out = scaled_dot_product_attention(qh, kh, vh, opts...);  // [B, Hkv, G, N, Dh]
  constexpr ir::Shape merged{Q::shape[0], Q::shape[1], e};
  return detail::reshape_to<merged>(permute<0, 3, 1, 2, 4>(out));
}

}  // namespace qkv::dsl
