// What the architectures' graph builders share (models/gpt2.cpp, llama.cpp): the inputs of a
// generation step against a key/value cache, and lowering with updates of held inputs.
#pragma once

#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::models::detail {

/// No cache: the whole sequence at once, plain causal attention.
struct NoCache {};
/// A step against the cache: each query sees the keys at positions <= its own.
template <class Positions, class Start> struct Cache {
  Positions positions;  // i32 [B, T]: each new token's position
  Start start;          // i32 []: where the step's keys and values are written in the cache
};

/// The graph's updates: each held input and the term of its new value.
using Updates = std::vector<std::pair<std::string, dsl::detail::TermPtr>>;

/// The cache's keep-mask for scores of rank R ([B, ..., T, S]): key kv_idx is seen by query t of
/// batch entry b when kv_idx <= positions[b, t]; the positions laid out as [B, 1.., T, 1].
template <int R, class Positions> auto up_to_position(Positions positions) {
  constexpr ir::Shape laid = [] {
    ir::Shape s{Positions::shape[0]};
    for (int i = 1; i < R - 2; ++i) s.push_back(1);
    s.push_back(Positions::shape[1]);
    s.push_back(1);
    return s;
  }();
  auto at_query = dsl::detail::reshape_to<laid>(cast(positions));
  return mask_mod([=](auto, auto, auto, auto kv_idx) { return kv_idx <= at_query; });
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

/// Lowers `logits` (output "logits"), `hidden` when given (output "hidden"), and the updates, then
/// binds the architecture's sizes.
template <Expr L, class Hidden>
ir::Graph lower_step(const L& logits, const Hidden* hidden, const Updates& updates, const std::map<std::string, std::int64_t>& sizes) {
  dsl::detail::Lowerer l;
  l.graph().set_output("logits", l.emit(logits.term()));
  if (hidden) l.graph().set_output("hidden", l.emit(hidden->term()));
  for (const auto& [name, term] : updates) l.graph().set_update(name, l.emit(term));
  return ir::specialize_dims(l.graph(), sizes);
}

}  // namespace qkv::models::detail
