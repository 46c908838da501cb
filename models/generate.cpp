// The generation loop: prefill, then decode steps, each a run of the step graph with the cache
// held by the executable.
#include "models/generate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "ir/error.hpp"

namespace qkv::models {

std::int32_t pick_token(const float* logits, std::int64_t vocab, const Sampling& s, std::uint64_t step) {
  if (s.temperature <= 0.0) return static_cast<std::int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  // NaN logits sort last (never picked while a number is there).
  auto key = [&](std::int32_t i) { return std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i]; };
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return key(a) > key(b); });
  std::size_t keep = order.size();
  if (s.top_k > 0) keep = std::min<std::size_t>(keep, static_cast<std::size_t>(s.top_k));
  std::vector<double> p(keep);
  const double top = logits[order[0]] / s.temperature;
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) total += p[i] = std::exp(logits[order[i]] / s.temperature - top);
  if (s.top_p < 1.0) {
    // The smallest prefix (by probability, largest first) whose mass reaches top_p; at least one.
    double mass = 0;
    std::size_t n = 0;
    while (n < keep && (n == 0 || mass < s.top_p * total)) mass += p[n++];
    keep = n;
    total = mass;
  }
  // One draw per step from a generator keyed by (seed, step): repeatable however it is called.
  std::mt19937_64 rng(s.seed * 0x9E3779B97F4A7C15ull + step);
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (std::size_t i = 0; i < keep; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[keep - 1];
}

Generator::Generator(const Pretrained& model, backend::Backend& backend, std::int64_t max_length) : model_(model), max_length_(max_length) {
  if (model.step_graph.size() == 0)
    throw UsageError(model.dir + ": a " + model.model_type + " model does not generate (decoders such as gpt2 and llama do)");
  if (max_length <= 0 || max_length > model.max_positions)
    throw UsageError("generate: " + std::to_string(max_length) + " positions asked for, the model has " + std::to_string(model.max_positions));
  exe_ = backend.compile(model.step_graph);
  state_ = backend::TensorMap(model.weights.begin(), model.weights.end());
  for (std::int64_t l = 0; l < model.layers; ++l)
    for (const char* which : {".key", ".value"})
      state_.emplace("past." + std::to_string(l) + which, Tensor(DType::f32, {1, model.kv_heads, max_length, model.head_dim}));
}

std::vector<std::int32_t> Generator::generate(const std::vector<std::int32_t>& prompt, const GenerationOptions& o,
                                              const std::function<bool(std::int32_t)>& on_token) {
  if (prompt.empty()) throw UsageError("generate: the prompt has no tokens");
  for (std::int32_t id : prompt)
    if (id < 0 || id >= model_.vocab_size)
      throw UsageError("generate: token id " + std::to_string(id) + " is outside the model's vocabulary of " + std::to_string(model_.vocab_size));
  if (o.max_new_tokens < 0 || o.max_new_tokens > max_length_)
    throw UsageError("generate: max_new_tokens outside [0, " + std::to_string(max_length_) + "]");
  const auto length = static_cast<std::int64_t>(prompt.size());
  if (length + o.max_new_tokens > max_length_)
    throw UsageError("generate: a prompt of " + std::to_string(length) + " tokens and " + std::to_string(o.max_new_tokens) + " new ones exceed " +
                     std::to_string(max_length_) + " positions");
  std::vector<std::int64_t> stop = o.stop_tokens;
  if (o.use_model_stop_tokens) stop.insert(stop.end(), model_.eos_token_ids.begin(), model_.eos_token_ids.end());
  // A fresh cache: positions past what this generation writes are never read (the mask hides them).
  exe_->set_state(state_);
  std::vector<std::int32_t> out;
  std::vector<std::int32_t> step_ids = prompt;
  std::int64_t position = 0;
  for (std::int64_t n = 0; n < o.max_new_tokens; ++n) {
    const auto t = static_cast<std::int64_t>(step_ids.size());
    Tensor ids = Tensor::from<std::int32_t>({1, t}, step_ids);
    Tensor positions(DType::i32, {1, t});
    for (std::int64_t i = 0; i < t; ++i) positions.data<std::int32_t>()[i] = static_cast<std::int32_t>(position + i);
    Tensor start = Tensor::from<std::int32_t>({}, {static_cast<std::int32_t>(position)});
    const backend::TensorMap result = exe_->run({{"input_ids", ids}, {"position_ids", positions}, {"cache_start", start}});
    const Tensor& logits = result.at("logits");
    const Tensor last = logits.dtype() == DType::f32 ? logits : logits.to(DType::f32);
    const std::int32_t next = pick_token(last.data<float>() + (last.numel() - model_.vocab_size), model_.vocab_size, o.sampling,
                                         static_cast<std::uint64_t>(n));  // the last position's row
    out.push_back(next);
    position += t;
    step_ids = {next};
    if (on_token && !on_token(next)) break;
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) break;
  }
  return out;
}

}  // namespace qkv::models
