// Losses for training, written with the DSL's ops.
#pragma once

#include "dsl/ops.hpp"

namespace qkv::dsl {

/// Mean squared error over every element: mean((prediction - target)^2), a scalar.
template <Expr P, Expr T> constexpr auto mse(P prediction, T target) {
  auto d = prediction - target;
  return mean_all(d * d);
}

/// Cross-entropy of logits [..., C] against i32 class targets [...]: the mean over positions of
/// -log softmax(logits)[target], through a stable log-softmax. A target outside [0, C) adds 0
/// (use it to leave positions out, like PyTorch's ignore_index, though they still count in the
/// mean).
template <Expr L, Expr T> constexpr auto cross_entropy(L logits, T targets) {
  static_assert(T::dtype == DType::i32, "qkv: cross_entropy targets are i32 class ids");
  constexpr std::int64_t classes = L::shape.back(0);
  static_assert(!ir::is_symbol(classes), "qkv: cross_entropy needs a static number of classes");
  return -mean_all(sum<-1, false>(one_hot<classes>(targets) * log_softmax<-1>(logits)));
}

}  // namespace qkv::dsl
