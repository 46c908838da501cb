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
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<16>);
///   auto kpm = input<"key_padding_mask", DType::boolean>(dim<"B">, dim<"T">);
///   auto [out, w] = self_attention<4>(x, mha_params<"attn", 16>(), key_padding_bias(kpm));
///   auto avg = mean_over_heads(w);  // torch's average_attn_weights=True: [B, T, T]
/// \endcode
template <Expr K>
constexpr auto key_padding_bias(K key_padding_mask) {
  static_assert(K::dtype == DType::boolean && K::shape.rank == 2, "qkv: key_padding_mask is bool [batch, keys]");
  constexpr ir::Shape s{K::shape[0], 1, 1, K::shape[1]};
  return detail::reshape_to<s>(where(key_padding_mask, kNegInf, 0.0));
}

/// torch.nn.MultiheadAttention's boolean attn_mask (true: the query may *not* attend that key),
/// [N, M] or [B, H, N, M], as an additive bias (-inf where true). The scaled dot-product
/// convention is the opposite; see attention_weights.
template <Expr M>
constexpr auto attn_mask_bias(M attn_mask) {
  static_assert(M::dtype == DType::boolean, "qkv: attn_mask_bias takes torch's boolean attn_mask; a float mask is a bias already");
  return where(attn_mask, kNegInf, 0.0);
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
///   auto [out, weights] = multi_head_attention<8>(
///       x, x, x, input<"wq">(dim<64>, dim<64>), input<"wk">(dim<64>, dim<64>), input<"wv">(dim<64>, dim<64>),
///       input<"bq">(dim<64>), input<"bk">(dim<64>), input<"bv">(dim<64>), input<"wo">(dim<64>, dim<64>), input<"bo">(dim<64>), causal);
/// \endcode
template <std::int64_t H, Expr Q, Expr K, Expr V, Expr Wq, Expr Wk, Expr Wv, class Bq, class Bk, class Bv, Expr Wo, class Bo, class... Opts>
constexpr auto multi_head_attention(Q query, K key, V value, Wq wq, Wk wk, Wv wv, Bq bq, Bk bk, Bv bv, Wo wo, Bo bo, Opts... opts) {
  auto q = split_heads<H>(add_bias(linear(query, wq), bq));
  auto k = split_heads<H>(add_bias(linear(key, wk), bk));
  auto v = split_heads<H>(add_bias(linear(value, wv), bv));
  auto w = attention_weights(q, k, opts...);
  auto out = add_bias(linear(merge_heads(matmul(w, v)), wo), bo);
  return HeadsResult<decltype(out), decltype(w)>{out, w};
}

/// The parameters of torch.nn.MultiheadAttention as expressions: projection weights [out, in]
/// and biases (or no_bias), usually made by mha_params or mha_params_kv.
template <class Wq, class Wk, class Wv, class Bq, class Bk, class Bv, class Wo, class Bo>
struct MhaParams {
  Wq wq;
  Wk wk;
  Wv wv;
  Bq bq;
  Bk bk;
  Bv bv;
  Wo wo;
  Bo bo;
};
template <class... Ts>
constexpr MhaParams<Ts...> make_mha_params(Ts... ts) { return {ts...}; }

/// Inputs named as torch.nn.MultiheadAttention(E, H, bias=Bias)'s state_dict under `Prefix`:
/// "<Prefix>.in_proj_weight" [3E, E] (its row blocks are W_q, W_k, W_v), "<Prefix>.in_proj_bias"
/// [3E], "<Prefix>.out_proj.weight" [E, E], "<Prefix>.out_proj.bias" [E]. Slices take the blocks
/// without copies of the parameters in the user's files.
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<64>);
///   auto [out, w] = multi_head_attention<8>(x, x, x, mha_params<"self_attn", 64>(), causal);
/// \endcode
template <FixedString Prefix, std::int64_t E, bool Bias = true>
constexpr auto mha_params() {
  auto w = input<param_path<Prefix, "in_proj_weight">()>(dim<3 * E>, dim<E>);
  auto wo = input<param_path<Prefix, "out_proj.weight">()>(dim<E>, dim<E>);
  if constexpr (Bias) {
    auto b = input<param_path<Prefix, "in_proj_bias">()>(dim<3 * E>);
    return make_mha_params(slice<0, 0, E>(w), slice<0, E, 2 * E>(w), slice<0, 2 * E, 3 * E>(w), slice<0, 0, E>(b),
                           slice<0, E, 2 * E>(b), slice<0, 2 * E, 3 * E>(b), wo, input<param_path<Prefix, "out_proj.bias">()>(dim<E>));
  } else {
    return make_mha_params(slice<0, 0, E>(w), slice<0, E, 2 * E>(w), slice<0, 2 * E, 3 * E>(w), no_bias, no_bias, no_bias, wo, no_bias);
  }
}

/// torch.nn.MultiheadAttention(E, H, kdim=Kdim, vdim=Vdim)'s parameters, stored separately when
/// kdim or vdim differ from E: "<Prefix>.q_proj_weight" [E, E], "k_proj_weight" [E, Kdim],
/// "v_proj_weight" [E, Vdim], "in_proj_bias" [3E], "out_proj.weight", "out_proj.bias".
template <FixedString Prefix, std::int64_t E, std::int64_t Kdim, std::int64_t Vdim, bool Bias = true>
constexpr auto mha_params_kv() {
  auto wq = input<param_path<Prefix, "q_proj_weight">()>(dim<E>, dim<E>);
  auto wk = input<param_path<Prefix, "k_proj_weight">()>(dim<E>, dim<Kdim>);
  auto wv = input<param_path<Prefix, "v_proj_weight">()>(dim<E>, dim<Vdim>);
  auto wo = input<param_path<Prefix, "out_proj.weight">()>(dim<E>, dim<E>);
  if constexpr (Bias) {
    auto b = input<param_path<Prefix, "in_proj_bias">()>(dim<3 * E>);
    return make_mha_params(wq, wk, wv, slice<0, 0, E>(b), slice<0, E, 2 * E>(b), slice<0, 2 * E, 3 * E>(b), wo,
                           input<param_path<Prefix, "out_proj.bias">()>(dim<E>));
  } else {
    return make_mha_params(wq, wk, wv, no_bias, no_bias, no_bias, wo, no_bias);
  }
}

/// Multi-head attention with a parameter bundle; see the long form above.
template <std::int64_t H, Expr Q, Expr K, Expr V, class... Ps, class... Opts>
constexpr auto multi_head_attention(Q query, K key, V value, MhaParams<Ps...> p, Opts... opts) {
  return multi_head_attention<H>(query, key, value, p.wq, p.wk, p.wv, p.bq, p.bk, p.bv, p.wo, p.bo, opts...);
}

/// Self-attention: queries, keys and values from one sequence x [B, T, E].
template <std::int64_t H, Expr X, class... Ps, class... Opts>
constexpr auto self_attention(X x, MhaParams<Ps...> p, Opts... opts) {
  return multi_head_attention<H>(x, x, x, p, opts...);
}
/// Causal self-attention: position t attends to positions <= t.
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<32>);
///   auto y = causal_self_attention<4>(x, mha_params<"attn", 32>()).output;
/// \endcode
template <std::int64_t H, Expr X, class... Ps, class... Opts>
constexpr auto causal_self_attention(X x, MhaParams<Ps...> p, Opts... opts) {
  return multi_head_attention<H>(x, x, x, p, causal, opts...);
}
/// Cross-attention: queries from x [B, N, E], keys and values from memory [B, M, Ek] (another
/// sequence, of another length: an encoder's output).
/// \code
///   auto dec = input<"dec">(dim<"B">, dim<5>, dim<16>);
///   auto enc = input<"enc">(dim<"B">, dim<8>, dim<16>);
///   auto [ctx, w] = cross_attention<2>(dec, enc, mha_params<"cross", 16>());  // w: [B, 2, 5, 8]
/// \endcode
template <std::int64_t H, Expr X, Expr M, class... Ps, class... Opts>
constexpr auto cross_attention(X x, M memory, MhaParams<Ps...> p, Opts... opts) {
  return multi_head_attention<H>(x, memory, memory, p, opts...);
}

/// Self-attention with no weights (the first step of most tutorials): softmax(x xᵀ) x over
/// x [..., T, D], unscaled.
/// \code
///   auto x = input<"x">(dim<6>, dim<3>);
///   auto context = simple_self_attention(x);  // [6, 3]
/// \endcode
template <Expr X>
constexpr auto simple_self_attention(X x) {
  return matmul(softmax<-1>(matmul<false, true>(x, x)), x);
}

/// Self-attention with raw weight matrices W [D_in, D_out] (x @ W, no bias), scaled by
/// 1/sqrt(D_out); `opts` as scaled_dot_product_attention's.
/// \code
///   auto x = input<"x">(dim<6>, dim<3>);
///   auto ctx = self_attention_raw(x, input<"W_query">(dim<3>, dim<2>), input<"W_key">(dim<3>, dim<2>),
///                                 input<"W_value">(dim<3>, dim<2>), causal);
/// \endcode
template <Expr X, Expr Wq, Expr Wk, Expr Wv, class... Opts>
constexpr auto self_attention_raw(X x, Wq wq, Wk wk, Wv wv, Opts... opts) {
  return scaled_dot_product_attention(matmul(x, wq), matmul(x, wk), matmul(x, wv), opts...);
}

/// Joins per-head results along the last dim: the "multi-head wrapper" of independent
/// single-head attentions (each its own weights), concatenated.
/// \code
///   auto x = input<"x">(dim<"B">, dim<6>, dim<3>);
///   auto heads = concat_heads(self_attention_raw(x, input<"q0">(dim<3>, dim<2>), input<"k0">(dim<3>, dim<2>), input<"v0">(dim<3>, dim<2>), causal),
///                             self_attention_raw(x, input<"q1">(dim<3>, dim<2>), input<"k1">(dim<3>, dim<2>), input<"v1">(dim<3>, dim<2>), causal));
/// \endcode
template <Expr A>
constexpr auto concat_heads(A a) { return a; }
template <Expr A, Expr B, Expr... Rest>
constexpr auto concat_heads(A a, B b, Rest... rest) { return concat_heads(concat<-1>(a, b), rest...); }

/// Grouped-query attention: H query heads share Hkv key/value heads (Hkv divides H; Hkv = 1 is
/// multi-query attention).
/// \code
///   auto q = input<"q">(dim<"B">, dim<"N">, dim<64>);  // 8 heads of 8
///   auto k = input<"k">(dim<"B">, dim<"N">, dim<16>);  // 2 key/value heads of 8
///   auto v = input<"v">(dim<"B">, dim<"N">, dim<16>);
///   auto out = grouped_query_attention<8, 2>(q, k, v, causal);  // [B, N, 64]
/// \endcode q [B, N, H * Dh], k and v [B, M, Hkv * Dh], already projected; the
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
