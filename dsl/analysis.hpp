// Helpers for studying attention weights [..., Lq, Lk]: how spread or peaked each query's
// distribution is.
#pragma once

#include "dsl/ops.hpp"

namespace qkv::dsl {

/// Entropy of each query's weights in nats, -sum_j w log w: [..., Lq]. 0 for a one-hot row,
/// log(Lk) for a uniform one; masked keys (w = 0) add 0, and the gradient stays finite there.
/// \code
///   auto w = input<"w">(dim<"B">, dim<4>, dim<"N">, dim<"M">);
///   auto h = attention_entropy(w);  // [B, 4, N]
/// \endcode
template <Expr W> constexpr auto attention_entropy(W w) {
  auto safe = where(greater(w, 0.0), w, 1.0);  // log(1) = 0 where w = 0, so no 0 * -inf
  return -sum<-1, false>(w * log(safe));
}

/// The largest weight of each query row: [..., Lq].
/// \code
///   auto q = input<"q">(dim<"N">, dim<16>);
///   auto peak = max_weight(attention_weights(q, q, causal));  // [N]
/// \endcode
template <Expr W> constexpr auto max_weight(W w) { return max<-1, false>(w); }

}  // namespace qkv::dsl
