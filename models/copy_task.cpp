// The copy task and the tiny causal transformer that learns it, written in the DSL.
#include <cmath>
#include <random>

#include "dsl/dsl.hpp"
#include "models/models.hpp"

namespace qkv::models {

ir::Graph copy_task_model() {
  constexpr std::int64_t V = CopyTask::vocab, T = CopyTask::seq, D = CopyTask::dim;
  auto tokens = input<"tokens", DType::i32>(dim<"B">, dim<T>);
  auto targets = input<"targets", DType::i32>(dim<"B">, dim<T>);
  auto embed = input<"embed">(dim<V>, dim<D>);
  auto pos = input<"pos">(dim<T>, dim<D>);
  auto wq = input<"wq">(dim<D>, dim<D>);
  auto wk = input<"wk">(dim<D>, dim<D>);
  auto wv = input<"wv">(dim<D>, dim<D>);
  auto wo = input<"wo">(dim<D>, dim<D>);
  auto head = input<"head">(dim<D>, dim<V>);
  auto x = matmul(one_hot<V>(tokens), embed) + pos;  // token embeddings plus learned positions
  auto attended = scaled_dot_product_attention(matmul(x, wq), matmul(x, wk), matmul(x, wv), causal);
  auto logits = matmul(x + matmul(attended, wo), head);  // a residual connection, then the head
  return lower(named<"loss">(cross_entropy(logits, targets)));
}

std::vector<std::string> copy_task_params() { return {"embed", "pos", "wq", "wk", "wv", "wo", "head"}; }

std::map<std::string, Tensor, std::less<>> copy_task_batch(std::int64_t batch, std::uint64_t seed) {
  constexpr std::int64_t L = CopyTask::length, T = CopyTask::seq;
  std::mt19937_64 rng(seed);
  Tensor tokens(DType::i32, {batch, T}), targets(DType::i32, {batch, T});
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int32_t* tok = tokens.data<std::int32_t>() + b * T;
    std::int32_t* tgt = targets.data<std::int32_t>() + b * T;
    for (std::int64_t i = 0; i < L; ++i) tok[i] = static_cast<std::int32_t>(rng() % CopyTask::symbols);
    tok[L] = CopyTask::separator;
    for (std::int64_t i = 0; i < L; ++i) tok[L + 1 + i] = tok[i];
    // Each position predicts the next token; only the copy (from the separator on) is predictable.
    for (std::int64_t p = 0; p < T; ++p) tgt[p] = p >= L && p + 1 < T ? tok[p + 1] : -1;
  }
  return {{"tokens", tokens}, {"targets", targets}};
}

double copy_task_chance_loss() {
  // Scored positions guess among `symbols` tokens; unscored ones add 0 to the mean over T.
  return static_cast<double>(CopyTask::length) / CopyTask::seq * std::log(static_cast<double>(CopyTask::symbols));
}

}  // namespace qkv::models
