// What the architectures' graph builders share (models/gpt2.cpp, llama.cpp): the inputs of a
// generation step against a key/value cache, and lowering with updates of held inputs.
#pragma once

#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::models::detail {

/// No cache: the whole sequence at once, plain causal attention.
struct NoCache {};
/// A step against the cache. Sequences of a batch share the cache's slots: the step's T new
/// tokens go to slots [start, start + T) of every sequence, and a shorter prompt is padded on the
/// left, so that sequence b's tokens start at slot first[b] (its positions counting from there).
/// Query t of sequence b sees the keys in slots [first[b], start + t].
template <class Positions, class Start, class First> struct Cache {
  Positions positions;  // i32 [B, T]: each new token's position in its sequence (embeddings, RoPE)
  Start start;          // i32 []: the slot the step's first token is written to, in every sequence
  First first;          // i32 [B]: each sequence's first slot (0 unless its prompt was padded)
};

/// The step-graph inputs of a Cache: position_ids [B, T], cache_start [], cache_first [B].
inline auto cache_inputs() {
  using namespace dsl;
  auto positions = input<"position_ids", DType::i32>(dim<"B">, dim<"T">);
  auto start = input<"cache_start", DType::i32>();
  auto first = input<"cache_first", DType::i32>(dim<"B">);
  return Cache<decltype(positions), decltype(start), decltype(first)>{positions, start, first};
}

/// A step against a paged cache: each sequence's slots are its positions (no padding), held in
/// pages of the pool "past.<layer>.key/value" [pages, heads, page, head dim] that its block table
/// row names, the step's tokens written at the slots the caller maps them to (vLLM's slot
/// mapping: -1 for none). Query t of sequence b sees the slots [0, positions[b, t]].
template <class Positions, class Slots, class Table> struct PagedCache {
  Positions positions;  // i32 [B, T]: each new token's position in its sequence, which is its slot
  Slots slots;          // i32 [B, T]: the pool row each new token's key and value go to
  Table table;          // i32 [B, NP]: each sequence's pages in order (-1: none yet)
};

/// The step-graph inputs of a PagedCache: position_ids [B, T], cache_slots [B, T], block_table [B, NP].
inline auto paged_cache_inputs() {
  using namespace dsl;
  auto positions = input<"position_ids", DType::i32>(dim<"B">, dim<"T">);
  auto slots = input<"cache_slots", DType::i32>(dim<"B">, dim<"T">);
  auto table = input<"block_table", DType::i32>(dim<"B">, dim<"NP">);
  return PagedCache<decltype(positions), decltype(slots), decltype(table)>{positions, slots, table};
}

template <class C> constexpr bool is_paged = false;
template <class P, class S, class T> constexpr bool is_paged<PagedCache<P, S, T>> = true;

/// Named terms: extra outputs (each layer's attention weights), or the graph's updates (each
/// held input and the term of its new value).
using Named = std::vector<std::pair<std::string, dsl::detail::TermPtr>>;
using Updates = Named;

/// A bound per query for scores of rank R ([B, ..., T, S]) from positions [B, T]: [B, 1.., T, 1].
template <int R, class Positions> constexpr ir::Shape per_query_shape() {
  ir::Shape s{Positions::shape[0]};
  for (int i = 1; i < R - 2; ++i) s.push_back(1);
  s.push_back(Positions::shape[1]);
  s.push_back(1);
  return s;
}

/// The cache's keep-mask for scores of rank R ([B, ..., T, S]): key slot kv_idx is seen by query
/// t of sequence b when first[b] <= kv_idx <= start + t, written as 0 <= start + t - kv_idx <=
/// start + t - first[b] so that both comparisons span the scores and stay in the fused kernel's
/// modifier (a bound on kv_idx alone, [B, ..., 1, S], would be computed outside it, over a grid
/// that reads the cache). The per-query bounds are laid out as [B, 1.., T, 1].
template <int R, class C> auto visible_slots(const C& cache) {
  using Positions = decltype(cache.positions);
  constexpr ir::Shape per_query = per_query_shape<R, Positions>();
  constexpr ir::Shape column{Positions::shape[0], 1};
  auto slot_of = iota<1>(cast(cache.positions)) + cast(cache.start);  // [B, T]: each query's slot
  auto slot = dsl::detail::reshape_to<per_query>(slot_of);
  auto reach = dsl::detail::reshape_to<per_query>(slot_of - dsl::detail::reshape_to<column>(cast(cache.first)));
  return mask_mod([=](auto, auto, auto, auto kv_idx) {
    auto back = slot - kv_idx;  // how many slots before the query's the key is
    return back >= 0.0 && back <= reach;
  });
}

/// The paged cache's keep-mask for scores of rank R: key slot kv_idx is seen by query t of
/// sequence b when kv_idx <= positions[b, t] (its slots are its positions), the bound laid out as
/// [B, 1.., T, 1] so that the comparison spans the scores and stays in the fused kernel's
/// modifier, which then skips the key tiles past a sequence's end.
template <int R, class C> auto visible_pages(const C& cache) {
  using Positions = decltype(cache.positions);
  constexpr ir::Shape per_query = per_query_shape<R, Positions>();
  auto slot = dsl::detail::reshape_to<per_query>(cast(cache.positions));
  return mask_mod([=](auto, auto, auto, auto kv_idx) { return slot - kv_idx >= 0.0; });
}

/// Writes a step's keys k and values v [B, Heads, T, Dh] of layer `layer` into the held cache
/// (recording the updates) and gives what attention reads, [B, Heads, S, Dh], with the mask of
/// the slots each query sees for scores of rank R: the contiguous cache "past.<layer>.key/value"
/// [B, Heads, S, Dh] (cache_write at cache_start), or the pages [pages, Heads, page, Dh] written
/// at the slots and read through the block table.
template <dsl::DimArg Heads, dsl::DimArg Dh, int R, class C, dsl::Expr K, dsl::Expr V>
auto cached_keys_values(const C& cache, std::size_t layer, K k, V v, Updates& updates) {
  using namespace dsl;
  const std::string past = "past." + std::to_string(layer);
  if constexpr (is_paged<C>) {
    auto keys = page_write(param(past + ".key", dim<"pages">, dim<Heads>, dim<"page">, dim<Dh>), k, cache.slots);
    auto values = page_write(param(past + ".value", dim<"pages">, dim<Heads>, dim<"page">, dim<Dh>), v, cache.slots);
    updates.emplace_back(past + ".key", keys.term());
    updates.emplace_back(past + ".value", values.term());
    return std::tuple{page_gather(keys, cache.table), page_gather(values, cache.table), visible_pages<R>(cache)};
  } else {
    auto keys = cache_write<2>(param(past + ".key", dim<"B">, dim<Heads>, dim<"S">, dim<Dh>), k, cache.start);
    auto values = cache_write<2>(param(past + ".value", dim<"B">, dim<Heads>, dim<"S">, dim<Dh>), v, cache.start);
    updates.emplace_back(past + ".key", keys.term());
    updates.emplace_back(past + ".value", values.term());
    return std::tuple{keys, values, visible_slots<R>(cache)};
  }
}

/// The rows the head reads: every position without a cache; in a step against one, the last
/// position of each sequence alone ([B, 1, E]), since the next token is picked from it. The head
/// is the largest matmul ([E, vocab]): a prefill of P tokens would run it on P rows and hold P
/// rows of logits (transformers' generate keeps the last logits too, logits_to_keep=1).
template <class C, Expr X> auto head_rows(X h) {
  if constexpr (std::is_same_v<C, NoCache>) {
    return h;
  } else {
    auto t = iota<1>(h);
    return sum<1>(where(t == max<1>(t), h, 0.0));  // a select, not a product: other rows' values never reach it
  }
}

/// Lowers `logits` (output "logits"), `hidden` when given (output "hidden"), the `extra` outputs
/// and the updates, then binds the architecture's sizes.
template <Expr L, class Hidden>
ir::Graph lower_step(const L& logits, const Hidden* hidden, const Named& extra, const Updates& updates,
                     const std::map<std::string, std::int64_t>& sizes) {
  dsl::detail::Lowerer l;
  l.graph().set_output("logits", l.emit(logits.term()));
  if (hidden) l.graph().set_output("hidden", l.emit(hidden->term()));
  for (const auto& [name, term] : extra) l.graph().set_output(name, l.emit(term));
  for (const auto& [name, term] : updates) l.graph().set_update(name, l.emit(term));
  return ir::specialize_dims(l.graph(), sizes);
}

}  // namespace qkv::models::detail
