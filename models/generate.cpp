// The generation loop: prefill, then decode steps, each a run of the step graph with the cache
// held by the executable.
#include "models/generate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <utility>

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

Generator::Generator(const Pretrained& model, backend::Backend& backend, std::int64_t max_length, std::int64_t batch)
    : model_(model), max_length_(max_length), batch_(batch) {
  if (model.step_graph.size() == 0)
    throw UsageError(model.dir + ": a " + model.model_type + " model does not generate (decoders such as gpt2 and llama do)");
  if (max_length <= 0 || max_length > model.max_positions)
    throw UsageError("generate: " + std::to_string(max_length) + " positions asked for, the model has " + std::to_string(model.max_positions));
  if (batch < 1) throw UsageError("generate: a batch of " + std::to_string(batch) + " sequences");
  exe_ = backend.compile(model.step_graph);
  // Held once by the executable: the weights (views of the mapped checkpoint, not copies) and the
  // cache, moved in (one copy of it in memory).
  backend::TensorMap state(model.weights.begin(), model.weights.end());
  for (std::int64_t l = 0; l < model.layers; ++l)
    for (const char* which : {".key", ".value"})
      state.emplace("past." + std::to_string(l) + which, Tensor(DType::f32, {batch, model.kv_heads, max_length, model.head_dim}));
  exe_->set_state(std::move(state));
}

std::vector<std::int32_t> Generator::generate(const std::vector<std::int32_t>& prompt, const GenerationOptions& o,
                                              const std::function<bool(std::int32_t)>& on_token) {
  if (batch_ != 1) throw UsageError("generate: one prompt given to a generator of " + std::to_string(batch_) + " sequences");
  auto each = [&](std::size_t, std::int32_t id) { return !on_token || on_token(id); };
  return generate(std::vector<std::vector<std::int32_t>>{prompt}, o, each)[0];
}

std::vector<std::vector<std::int32_t>> Generator::generate(const std::vector<std::vector<std::int32_t>>& prompts, const GenerationOptions& o,
                                                           const std::function<bool(std::size_t, std::int32_t)>& on_token) {
  if (static_cast<std::int64_t>(prompts.size()) != batch_)
    throw UsageError("generate: " + std::to_string(prompts.size()) + " prompts given to a generator of " + std::to_string(batch_) + " sequences");
  std::int64_t longest = 0;
  for (const auto& prompt : prompts) {
    if (prompt.empty()) throw UsageError("generate: a prompt has no tokens");
    for (std::int32_t id : prompt)
      if (id < 0 || id >= model_.vocab_size)
        throw UsageError("generate: token id " + std::to_string(id) + " is outside the model's vocabulary of " + std::to_string(model_.vocab_size));
    longest = std::max(longest, static_cast<std::int64_t>(prompt.size()));
  }
  if (o.max_new_tokens < 0 || o.max_new_tokens > max_length_)
    throw UsageError("generate: max_new_tokens outside [0, " + std::to_string(max_length_) + "]");
  if (longest + o.max_new_tokens > max_length_)
    throw UsageError("generate: a prompt of " + std::to_string(longest) + " tokens and " + std::to_string(o.max_new_tokens) + " new ones exceed " +
                     std::to_string(max_length_) + " positions");
  std::vector<std::int64_t> stop = o.stop_tokens;
  if (o.use_model_stop_tokens) stop.insert(stop.end(), model_.eos_token_ids.begin(), model_.eos_token_ids.end());
  // Sequence b's prompt fills slots [pad_b, longest) of its cache (the cache as the last
  // generation left it: each slot a sequence reads it writes first, and the mask hides the rest).
  const std::int64_t b_count = batch_;
  std::vector<std::int32_t> pad(static_cast<std::size_t>(b_count));
  Tensor first(DType::i32, {b_count});
  for (std::int64_t b = 0; b < b_count; ++b) {
    pad[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(longest - static_cast<std::int64_t>(prompts[static_cast<std::size_t>(b)].size()));
    first.data<std::int32_t>()[b] = pad[static_cast<std::size_t>(b)];
  }
  Tensor ids(DType::i32, {b_count, longest}), positions(DType::i32, {b_count, longest});
  for (std::int64_t b = 0; b < b_count; ++b) {
    const auto& prompt = prompts[static_cast<std::size_t>(b)];
    const std::int32_t p = pad[static_cast<std::size_t>(b)];
    for (std::int64_t t = 0; t < longest; ++t) {
      // Padding repeats the first token at position 0 (no sequence's query ever sees it).
      ids.data<std::int32_t>()[b * longest + t] = t < p ? prompt[0] : prompt[static_cast<std::size_t>(t - p)];
      positions.data<std::int32_t>()[b * longest + t] = static_cast<std::int32_t>(std::max<std::int64_t>(0, t - p));
    }
  }
  std::vector<std::vector<std::int32_t>> out(static_cast<std::size_t>(b_count));
  if (o.max_new_tokens == 0) return out;
  std::vector<bool> done(static_cast<std::size_t>(b_count), false);
  std::int64_t slot = 0, live = b_count;
  // One step: ids and positions [B, T] into slots [slot, slot + T); each sequence's last logits.
  auto step = [&](const Tensor& step_ids, const Tensor& step_positions) {
    Tensor start = Tensor::from<std::int32_t>({}, {static_cast<std::int32_t>(slot)});
    const backend::TensorMap result =
        exe_->run({{"input_ids", step_ids}, {"position_ids", step_positions}, {"cache_start", start}, {"cache_first", first}});
    slot += step_ids.shape()[1];
    const Tensor& logits = result.at("logits");  // [B, 1, V]
    return logits.dtype() == DType::f32 ? logits : logits.to(DType::f32);
  };
  // Columns [from, from + count) of a prompt tensor [B, longest].
  auto columns = [&](const Tensor& t, std::int64_t from, std::int64_t count) {
    Tensor part(DType::i32, {b_count, count});
    for (std::int64_t b = 0; b < b_count; ++b) std::copy_n(t.data<std::int32_t>() + b * longest + from, count, part.data<std::int32_t>() + b * count);
    return part;
  };
  // The prompt in chunks: those before the last only fill the cache (their logits unused).
  const std::int64_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : longest;
  while (longest - slot > chunk) step(columns(ids, slot, chunk), columns(positions, slot, chunk));
  if (slot > 0) {
    Tensor rest_ids = columns(ids, slot, longest - slot), rest_positions = columns(positions, slot, longest - slot);
    ids = std::move(rest_ids);
    positions = std::move(rest_positions);
  }
  for (std::int64_t n = 0; n < o.max_new_tokens && live > 0; ++n) {
    const Tensor rows = step(ids, positions);
    Tensor next_ids(DType::i32, {b_count, 1}), next_positions(DType::i32, {b_count, 1});
    for (std::int64_t b = 0; b < b_count; ++b) {
      const auto i = static_cast<std::size_t>(b);
      // A finished sequence repeats its last token (its logits are not read).
      std::int32_t next = std::as_const(ids).data<std::int32_t>()[b * ids.shape()[1] + ids.shape()[1] - 1];
      if (!done[i]) {
        Sampling s = o.sampling;
        s.seed += static_cast<std::uint64_t>(b);
        next = pick_token(std::as_const(rows).data<float>() + b * model_.vocab_size, model_.vocab_size, s, static_cast<std::uint64_t>(n));
        out[i].push_back(next);
        const bool go_on = !on_token || on_token(i, next);
        if (!go_on || std::find(stop.begin(), stop.end(), next) != stop.end()) {
          done[i] = true;
          --live;
        }
      }
      next_ids.data<std::int32_t>()[b] = next;
      next_positions.data<std::int32_t>()[b] = static_cast<std::int32_t>(slot - pad[i]);
    }
    ids = std::move(next_ids);
    positions = std::move(next_positions);
  }
  return out;
}

}  // namespace qkv::models
