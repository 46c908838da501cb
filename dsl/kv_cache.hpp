// Incremental decoding: causal self-attention over new tokens and a key/value cache.
#pragma once

#include "dsl/multi_head.hpp"

namespace qkv::dsl {

/// cache with fresh's rows written at [start, start + T) along Axis (T: fresh's dim there; start
/// an i32 scalar input): a key/value cache allocated once for the longest sequence and written in
/// place each step, when the graph updates the held cache with it (Graph::set_update). Rows past
/// either end are dropped.
/// \code
///   auto cache = input<"past.0.key">(dim<"B">, dim<4>, dim<"S">, dim<16>);
///   auto fresh = input<"k">(dim<"B">, dim<4>, dim<"T">, dim<16>);
///   auto keys = cache_write<2>(cache, fresh, input<"start", DType::i32>());  // [B, 4, S, 16]
/// \endcode
template <int Axis, Expr C, Expr N, Expr S> constexpr auto cache_write(C cache, N fresh, S start) {
  constexpr ir::Attrs attrs = [] {
    ir::Attrs a;
    a.axis = Axis < 0 ? Axis + C::shape.rank : Axis;
    return a;
  }();
  return make_node<ir::Op::cache_write, attrs>(cache, fresh, start);
}

/// A paged key/value cache's update (vLLM's slot mapping): pages [P, H, page, D] with fresh
/// [B, H, T, D]'s rows written at slots [B, T] (i32: slot s is row s % page of page s / page;
/// slots outside [0, P page) are dropped, as a padded token's -1 is). The caller keeps the slots
/// of different tokens apart. Written in place where the graph updates the held pages with it.
/// \code
///   auto pages = input<"past.0.key">(dim<64>, dim<4>, dim<16>, dim<32>);  // 64 pages of 16 rows
///   auto fresh = input<"k">(dim<"B">, dim<4>, dim<"T">, dim<32>);
///   auto written = page_write(pages, fresh, input<"cache_slots", DType::i32>(dim<"B">, dim<"T">));
/// \endcode
template <Expr P, Expr N, Expr S> constexpr auto page_write(P pages, N fresh, S slots) { return make_node<ir::Op::page_write>(pages, fresh, slots); }

/// Pages [P, H, page, D] read through a block table [B, n] (i32 page numbers; entries outside
/// [0, P) read zeros, as a table's unallocated tail does): keys or values [B, H, n page, D], slot
/// s of sequence b being row s % page of page table[b, s / page]. Attention over them reads the
/// pages where they are on backends that fuse the gather (cpu); elsewhere it is a gather.
/// \code
///   auto keys = page_gather(written, input<"block_table", DType::i32>(dim<"B">, dim<"NP">));
/// \endcode
template <Expr P, Expr T> constexpr auto page_gather(P pages, T table) { return make_node<ir::Op::page_gather>(pages, table); }

/// The result of cached_self_attention: the output and the cache after the step.
template <class O, class K, class V> struct CachedAttention {
  O output;  ///< The output for the new tokens, [B, T, E].
  K keys;    ///< The cached keys after the step, [B, H, P+T, E/H].
  V values;  ///< The cached values after the step, [B, H, P+T, E/H].
};

/// One decoding step of causal multi-head self-attention with a key/value cache. x [B, T, E] are
/// the new tokens (T = 1 when generating), past_k and past_v [B, H, P, E/H] the cached keys and
/// values of the P earlier tokens (P may be 0). Returns the output for the new tokens and the
/// cache after appending them, keys and values [B, H, P+T, E/H]; the new queries attend to every
/// cached key and causally among themselves (bottom-right), so the output equals the full causal
/// computation's last T rows.
/// `p` are the attention's parameters (mha_params); `opts` go to scaled_dot_product_attention
/// after causal_bottom_right.
/// \code
///   auto x = input<"x">(dim<1>, dim<"T">, dim<32>);
///   auto past_k = input<"past_k">(dim<1>, dim<4>, dim<"P">, dim<8>);
///   auto past_v = input<"past_v">(dim<1>, dim<4>, dim<"P">, dim<8>);
///   auto step = cached_self_attention<4>(x, past_k, past_v, mha_params<"attn", 32>());
///   ir::Graph g = lower(named<"out">(step.output), named<"k">(step.keys), named<"v">(step.values));
/// \endcode
template <std::int64_t H, Expr X, Expr PK, Expr PV, class... Ps, class... Opts>
constexpr auto cached_self_attention(X x, PK past_k, PV past_v, MhaParams<Ps...> p, Opts... opts) {
  auto q = split_heads<H>(add_bias(linear(x, p.wq), p.bq));
  auto k = concat<2>(past_k, split_heads<H>(add_bias(linear(x, p.wk), p.bk)));
  auto v = concat<2>(past_v, split_heads<H>(add_bias(linear(x, p.wv), p.bv)));
  auto out = add_bias(linear(merge_heads(scaled_dot_product_attention(q, k, v, causal_bottom_right, opts...)), p.wo), p.bo);
  return CachedAttention<decltype(out), decltype(k), decltype(v)>{out, k, v};
}

}  // namespace qkv::dsl
