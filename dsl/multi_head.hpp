// Multi-head and grouped-query attention, built from scaled dot-product attention by splitting
// the embedding into heads with reshapes and permutations.
#pragma once

#include "dsl/attention.hpp"
#include "dsl/layers.hpp"

namespace qkv::dsl {

/// [B, L, E] -> [B, H, L, E/H]. H (a size or a name) must divide E: at compile time where both
/// are sizes, when the graph is bound otherwise.
template <DimArg H, Expr X> constexpr auto split_heads(X x) {
  static_assert(X::shape.rank == 3, "qkv: split_heads takes [batch, length, embed]");
  constexpr ir::Dim e = X::shape.back(0);
  static_assert(ir::is_symbol(e) || H.is_named() || (H.value > 0 && e % H.value == 0),
                "qkv: the embedding dim is not divisible by the number of heads");
  constexpr DimArg dh = DimArg::derived(ir::DimOp::quotient, e, H.value);
  constexpr ir::Shape s{X::shape[0], X::shape[1], H.value, dh.value};
  return permute<0, 2, 1, 3>(detail::reshape_to<s, DimList<H, dh>>(x));
}

/// [B, H, L, Dh] -> [B, L, H * Dh]; with E (a dim of the graph), [B, L, E] (the embedding the
/// heads were split from, so a named E stays E).
template <ir::Dim E = 0, Expr X> constexpr auto merge_heads(X x) {
  static_assert(X::shape.rank == 4, "qkv: merge_heads takes [batch, heads, length, head dim]");
  using P = decltype(permute<0, 2, 1, 3>(x));
  constexpr DimArg joined = E != 0 ? DimArg(E) : DimArg::derived(ir::DimOp::product, P::shape[2], P::shape[3]);
  constexpr ir::Shape s{P::shape[0], P::shape[1], joined.value};
  return detail::reshape_to<s, DimList<joined>>(permute<0, 2, 1, 3>(x));
}

namespace detail {
/// Rows [K E, (K + 1) E) of w [3E, ...] (in_proj_weight's and in_proj_bias' blocks): a slice
/// where E is a size, else a reshape to [3, E, ...], the block K, and a reshape back.
template <std::int64_t K, DimArg E, Expr W> constexpr auto row_block(W w) {
  if constexpr (!E.is_named()) {
    return slice<0, K * E.value, (K + 1) * E.value>(w);
  } else {
    // w's shape with its first dim E, after `front` (none when 0).
    constexpr auto rows = [](ir::Dim front) {
      ir::Shape r;
      if (front != 0) r.push_back(front);
      for (int i = 0; i < W::shape.rank; ++i) r.push_back(i == 0 ? E.value : W::shape[i]);
      return r;
    };
    return reshape_to<rows(0)>(slice<0, K, K + 1>(reshape_to<rows(3)>(w)));
  }
}
}  // namespace detail

/// PyTorch's key_padding_mask (true: the key is padding and is ignored, the opposite of the
/// scaled dot-product convention) [B, M] as an additive bias [B, 1, 1, M] for per-head scores.
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<16>);
///   auto kpm = input<"key_padding_mask", DType::boolean>(dim<"B">, dim<"T">);
///   auto [out, w] = self_attention<4>(x, mha_params<"attn", 16>(), key_padding_bias(kpm));
///   auto avg = mean_over_heads(w);  // torch's average_attn_weights=True: [B, T, T]
/// \endcode
template <Expr K> constexpr auto key_padding_bias(K key_padding_mask) {
  static_assert(K::dtype == DType::boolean && K::shape.rank == 2, "qkv: key_padding_mask is bool [batch, keys]");
  constexpr ir::Shape s{K::shape[0], 1, 1, K::shape[1]};
  return detail::reshape_to<s>(where(key_padding_mask, kNegInf, 0.0));
}

/// torch.nn.MultiheadAttention's boolean attn_mask (true: the query may *not* attend that key),
/// [N, M] or [B, H, N, M], as an additive bias (-inf where true). The scaled dot-product
/// convention is the opposite; see attention_weights.
template <Expr M> constexpr auto attn_mask_bias(M attn_mask) {
  static_assert(M::dtype == DType::boolean, "qkv: attn_mask_bias takes torch's boolean attn_mask; a float mask is a bias already");
  return where(attn_mask, kNegInf, 0.0);
}

/// The result of multi-head attention: the output [B, N, E] and the weights per head
/// [B, H, N, M] (mean_over_heads gives torch's average_attn_weights=True).
template <class Out, class W> struct HeadsResult {
  Out output;  ///< The output, [B, N, E].
  W weights;   ///< The attention weights of each head, [B, H, N, M].
};

/// Mean of per-head weights [B, H, N, M] over the heads: [B, N, M].
template <Expr W> constexpr auto mean_over_heads(W w) { return mean<1, false>(w); }

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
template <DimArg H, Expr Q, Expr K, Expr V, Expr Wq, Expr Wk, Expr Wv, class Bq, class Bk, class Bv, Expr Wo, class Bo, class... Opts>
constexpr auto multi_head_attention(Q query, K key, V value, Wq wq, Wk wk, Wv wv, Bq bq, Bk bk, Bv bv, Wo wo, Bo bo, Opts... opts) {
  auto q = split_heads<H>(add_bias(linear(query, wq), bq));
  auto k = split_heads<H>(add_bias(linear(key, wk), bk));
  auto v = split_heads<H>(add_bias(linear(value, wv), bv));
  auto w = attention_weights(q, k, opts...);
  using Projected = decltype(linear(query, wq));
  auto out = add_bias(linear(merge_heads<Projected::shape.back(0)>(matmul(w, v)), wo), bo);
  return HeadsResult<decltype(out), decltype(w)>{out, w};
}

/// The parameters of torch.nn.MultiheadAttention as expressions: projection weights [out, in]
/// and biases (or no_bias), usually made by mha_params or mha_params_kv.
template <class Wq, class Wk, class Wv, class Bq, class Bk, class Bv, class Wo, class Bo> struct MhaParams {
  Wq wq;  ///< The query projection's weight [E, E].
  Wk wk;  ///< The key projection's weight [E, Ek].
  Wv wv;  ///< The value projection's weight [E, Ev].
  Bq bq;  ///< The query projection's bias [E], or no_bias.
  Bk bk;  ///< The key projection's bias [E], or no_bias.
  Bv bv;  ///< The value projection's bias [E], or no_bias.
  Wo wo;  ///< The output projection's weight [E, E].
  Bo bo;  ///< The output projection's bias [E], or no_bias.
};
/// MhaParams of the eight parameters, in its members' order (wq, wk, wv, bq, bk, bv, wo, bo).
template <class... Ts> constexpr MhaParams<Ts...> make_mha_params(Ts... ts) { return {ts...}; }

/// Inputs named as torch.nn.MultiheadAttention(E, H, bias=Bias)'s state_dict under `Prefix`:
/// "<Prefix>.in_proj_weight" [3E, E] (its row blocks are W_q, W_k, W_v), "<Prefix>.in_proj_bias"
/// [3E], "<Prefix>.out_proj.weight" [E, E], "<Prefix>.out_proj.bias" [E]. Slices take the blocks
/// without copies of the parameters in the user's files. E may be a name, bound by the inputs
/// (E/H checked then); so may the heads, fixed to a size by ir::specialize_dims before running
/// (how the qkv tool builds its models for any size).
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<64>);
///   auto [out, w] = multi_head_attention<8>(x, x, x, mha_params<"self_attn", 64>(), causal);
///   auto y = input<"y">(dim<"B">, dim<"T">, dim<"E">);  // any embedding 8 divides
///   auto [out2, w2] = multi_head_attention<8>(y, y, y, mha_params<"attn", "E">());
/// \endcode
template <FixedString Prefix, DimArg E, bool Bias = true> constexpr auto mha_params() {
  auto w = input<param_path<Prefix, "in_proj_weight">()>(dim<3 * E>, dim<E>);
  auto wo = input<param_path<Prefix, "out_proj.weight">()>(dim<E>, dim<E>);
  if constexpr (Bias) {
    auto b = input<param_path<Prefix, "in_proj_bias">()>(dim<3 * E>);
    return make_mha_params(detail::row_block<0, E>(w), detail::row_block<1, E>(w), detail::row_block<2, E>(w), detail::row_block<0, E>(b),
                           detail::row_block<1, E>(b), detail::row_block<2, E>(b), wo, input<param_path<Prefix, "out_proj.bias">()>(dim<E>));
  } else {
    return make_mha_params(detail::row_block<0, E>(w), detail::row_block<1, E>(w), detail::row_block<2, E>(w), no_bias, no_bias, no_bias, wo,
                           no_bias);
  }
}

/// torch.nn.MultiheadAttention(E, H, kdim=Kdim, vdim=Vdim)'s parameters, stored separately when
/// kdim or vdim differ from E: "<Prefix>.q_proj_weight" [E, E], "k_proj_weight" [E, Kdim],
/// "v_proj_weight" [E, Vdim], "in_proj_bias" [3E], "out_proj.weight", "out_proj.bias".
template <FixedString Prefix, DimArg E, DimArg Kdim, DimArg Vdim, bool Bias = true> constexpr auto mha_params_kv() {
  auto wq = input<param_path<Prefix, "q_proj_weight">()>(dim<E>, dim<E>);
  auto wk = input<param_path<Prefix, "k_proj_weight">()>(dim<E>, dim<Kdim>);
  auto wv = input<param_path<Prefix, "v_proj_weight">()>(dim<E>, dim<Vdim>);
  auto wo = input<param_path<Prefix, "out_proj.weight">()>(dim<E>, dim<E>);
  if constexpr (Bias) {
    auto b = input<param_path<Prefix, "in_proj_bias">()>(dim<3 * E>);
    return make_mha_params(wq, wk, wv, detail::row_block<0, E>(b), detail::row_block<1, E>(b), detail::row_block<2, E>(b), wo,
                           input<param_path<Prefix, "out_proj.bias">()>(dim<E>));
  } else {
    return make_mha_params(wq, wk, wv, no_bias, no_bias, no_bias, wo, no_bias);
  }
}

/// Multi-head attention with a parameter bundle; see the long form above.
template <DimArg H, Expr Q, Expr K, Expr V, class... Ps, class... Opts>
constexpr auto multi_head_attention(Q query, K key, V value, MhaParams<Ps...> p, Opts... opts) {
  return multi_head_attention<H>(query, key, value, p.wq, p.wk, p.wv, p.bq, p.bk, p.bv, p.wo, p.bo, opts...);
}

/// Self-attention: queries, keys and values from one sequence x [B, T, E].
template <DimArg H, Expr X, class... Ps, class... Opts> constexpr auto self_attention(X x, MhaParams<Ps...> p, Opts... opts) {
  return multi_head_attention<H>(x, x, x, p, opts...);
}
/// Causal self-attention: position t attends to positions <= t.
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<32>);
///   auto y = causal_self_attention<4>(x, mha_params<"attn", 32>()).output;
/// \endcode
template <DimArg H, Expr X, class... Ps, class... Opts> constexpr auto causal_self_attention(X x, MhaParams<Ps...> p, Opts... opts) {
  return multi_head_attention<H>(x, x, x, p, causal, opts...);
}
/// Cross-attention: queries from x [B, N, E], keys and values from memory [B, M, Ek] (another
/// sequence, of another length: an encoder's output).
/// \code
///   auto dec = input<"dec">(dim<"B">, dim<5>, dim<16>);
///   auto enc = input<"enc">(dim<"B">, dim<8>, dim<16>);
///   auto [ctx, w] = cross_attention<2>(dec, enc, mha_params<"cross", 16>());  // w: [B, 2, 5, 8]
/// \endcode
template <DimArg H, Expr X, Expr M, class... Ps, class... Opts> constexpr auto cross_attention(X x, M memory, MhaParams<Ps...> p, Opts... opts) {
  return multi_head_attention<H>(x, memory, memory, p, opts...);
}

/// Self-attention with no weights (the first step of most tutorials): softmax(x xᵀ) x over
/// x [..., T, D], unscaled.
/// \code
///   auto x = input<"x">(dim<6>, dim<3>);
///   auto context = simple_self_attention(x);  // [6, 3]
/// \endcode
template <Expr X> constexpr auto simple_self_attention(X x) { return matmul(softmax<-1>(matmul<false, true>(x, x)), x); }

/// Self-attention with raw weight matrices W [D_in, D_out] (x @ W, no bias), scaled by
/// 1/sqrt(D_out); `opts` as scaled_dot_product_attention's.
/// \code
///   auto x = input<"x">(dim<6>, dim<3>);
///   auto ctx = self_attention_raw(x, input<"W_query">(dim<3>, dim<2>), input<"W_key">(dim<3>, dim<2>),
///                                 input<"W_value">(dim<3>, dim<2>), causal);
/// \endcode
template <Expr X, Expr Wq, Expr Wk, Expr Wv, class... Opts> constexpr auto self_attention_raw(X x, Wq wq, Wk wk, Wv wv, Opts... opts) {
  return scaled_dot_product_attention(matmul(x, wq), matmul(x, wk), matmul(x, wv), opts...);
}

/// Joins per-head results along the last dim: the "multi-head wrapper" of independent
/// single-head attentions (each its own weights), concatenated.
/// \code
///   auto x = input<"x">(dim<"B">, dim<6>, dim<3>);
///   auto heads = concat_heads(self_attention_raw(x, input<"q0">(dim<3>, dim<2>), input<"k0">(dim<3>, dim<2>), input<"v0">(dim<3>, dim<2>), causal),
///                             self_attention_raw(x, input<"q1">(dim<3>, dim<2>), input<"k1">(dim<3>, dim<2>), input<"v1">(dim<3>, dim<2>), causal));
/// \endcode
template <Expr A> constexpr auto concat_heads(A a) { return a; }
/// a, b and the rest concatenated along the last dim (see concat_heads(A)).
template <Expr A, Expr B, Expr... Rest> constexpr auto concat_heads(A a, B b, Rest... rest) { return concat_heads(concat<-1>(a, b), rest...); }

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
/// sinks(s) with s [H] gives each query head its sink (gpt-oss).
template <DimArg H, DimArg Hkv, Expr Q, Expr K, Expr V, class... Opts> constexpr auto grouped_query_attention(Q q, K k, V v, Opts... opts) {
  static_assert(H.is_named() || Hkv.is_named() || H.value % Hkv.value == 0,
                "qkv: the number of key/value heads must divide the number of query heads");
  constexpr ir::Dim e = Q::shape.back(0);
  static_assert(ir::is_symbol(e) || H.is_named() || e % H.value == 0, "qkv: the query embedding must be divisible by the heads");
  constexpr DimArg G = DimArg::derived(ir::DimOp::quotient, H.value, Hkv.value);
  constexpr DimArg dh = DimArg::derived(ir::DimOp::quotient, e, H.value);
  constexpr DimArg kv = DimArg::derived(ir::DimOp::product, Hkv.value, dh.value);
  static_assert(ir::dims_compatible(K::shape.back(0), kv.value) && ir::dims_compatible(V::shape.back(0), kv.value),
                "qkv: key/value embeddings must be Hkv * head dim");
  constexpr ir::Shape q5{Q::shape[0], Q::shape[1], Hkv.value, G.value, dh.value};
  constexpr ir::Shape k5{K::shape[0], K::shape[1], Hkv.value, 1, dh.value};
  // [B, N, Hkv, G, Dh] -> [B, Hkv, G, N, Dh]; keys and values [B, Hkv, 1, M, Dh] broadcast over G.
  auto qh = permute<0, 2, 3, 1, 4>(detail::reshape_to<q5, DimList<H, Hkv, G, dh>>(q));
  auto kh = permute<0, 2, 3, 1, 4>(detail::reshape_to<k5, DimList<H, Hkv, dh>>(k));
  auto vh = permute<0, 2, 3, 1, 4>(detail::reshape_to<k5, DimList<H, Hkv, dh>>(v));
  // Per-head sinks [H] follow the query heads: [Hkv, G, 1, 1].
  auto grouped = [](auto opt) {
    if constexpr (detail::is_sinks<decltype(opt)>::value) {
      if constexpr (decltype(opt.logits)::shape.rank == 1) {
        constexpr ir::Shape per_head{Hkv.value, G.value, 1, 1};
        return sinks(detail::reshape_to<per_head, DimList<H, Hkv, G>>(opt.logits));
      } else {
        return opt;
      }
    } else {
      return opt;
    }
  };
  auto out = scaled_dot_product_attention(qh, kh, vh, grouped(opts)...);  // [B, Hkv, G, N, Dh]
  constexpr ir::Shape merged{Q::shape[0], Q::shape[1], e};
  return detail::reshape_to<merged>(permute<0, 3, 1, 2, 4>(out));
}

}  // namespace qkv::dsl
