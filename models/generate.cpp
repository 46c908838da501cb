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

Generator::Generator(const Pretrained& model, backend::Backend& backend, CachePages cache)
    : model_(model), max_length_(model.max_positions), batch_(0), pages_(cache) {
  if (model.paged_step_graph.size() == 0)
    throw UsageError(model.dir + ": a " + model.model_type + " model does not generate (decoders such as gpt2 and llama do)");
  if (cache.pages < 1 || cache.page_size < 1)
    throw UsageError("generate: a paged cache of " + std::to_string(cache.pages) + " pages of " + std::to_string(cache.page_size) + " positions");
  exe_ = backend.compile(model.paged_step_graph);
  backend::TensorMap state(model.weights.begin(), model.weights.end());
  for (std::int64_t l = 0; l < model.layers; ++l)
    for (const char* which : {".key", ".value"})
      state.emplace("past." + std::to_string(l) + which, Tensor(DType::f32, {cache.pages, model.kv_heads, cache.page_size, model.head_dim}));
  exe_->set_state(std::move(state));
}

namespace {

/// The prompts' tokens checked against the vocabulary (and none empty).
void check_prompts(const std::vector<std::vector<std::int32_t>>& prompts, std::int64_t vocab) {
  for (const auto& prompt : prompts) {
    if (prompt.empty()) throw UsageError("generate: a prompt has no tokens");
    for (std::int32_t id : prompt)
      if (id < 0 || id >= vocab)
        throw UsageError("generate: token id " + std::to_string(id) + " is outside the model's vocabulary of " + std::to_string(vocab));
  }
}

/// A sequence of a paged generation: its tokens so far, the pages its block table lists, and
/// how many it may come to hold (its prompt and max_new_tokens, reserved when it is admitted).
struct PagedSequence {
  std::size_t index = 0;
  std::vector<std::int32_t> tokens;
  std::int64_t written = 0;  // slots [0, written) hold its keys and values
  std::vector<std::int32_t> pages;
  std::int64_t reserved = 0;
  std::int64_t produced = 0;
};

/// The cache's pages as sequences take and give them back: the last given back is taken first
/// (so that a page is reused while it is warm), and an admitted sequence's pages are promised to
/// it up front. Counts into `use` the pages in use at the peak and those taken again.
class PagePool {
 public:
  PagePool(const CachePages& cache, Generator::PageUse& use)
      : page_size_(cache.page_size), pages_(cache.pages), used_before_(static_cast<std::size_t>(cache.pages), false), use_(use) {
    for (std::int64_t p = 0; p < pages_; ++p) free_.push_back(static_cast<std::int32_t>(pages_ - 1 - p));
  }
  /// The pages `positions` take.
  std::int64_t pages_for(std::int64_t positions) const { return (positions + page_size_ - 1) / page_size_; }
  /// Promises s the pages its `positions` take, if the free ones not yet promised cover them.
  bool admit(PagedSequence& s, std::int64_t positions) {
    const std::int64_t need = pages_for(positions);
    if (need > static_cast<std::int64_t>(free_.size()) - promised_) return false;
    s.reserved = need;
    promised_ += need;
    return true;
  }
  /// Gives s the pages that `slots` positions take (of those promised).
  void take(PagedSequence& s, std::int64_t slots) {
    while (static_cast<std::int64_t>(s.pages.size()) < pages_for(slots)) {
      const std::int32_t page = free_.back();
      free_.pop_back();
      --promised_;
      if (used_before_[static_cast<std::size_t>(page)]) ++use_.reused_pages;
      used_before_[static_cast<std::size_t>(page)] = true;
      s.pages.push_back(page);
    }
    use_.peak_pages = std::max(use_.peak_pages, pages_ - static_cast<std::int64_t>(free_.size()));
  }
  /// Takes back s's pages and what it was promised beyond them.
  void give_back(PagedSequence& s) {
    for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) free_.push_back(*it);
    promised_ -= s.reserved - static_cast<std::int64_t>(s.pages.size());
    s.pages.clear();
  }

 private:
  std::int64_t page_size_, pages_;
  std::vector<std::int32_t> free_;
  std::vector<bool> used_before_;
  std::int64_t promised_ = 0;  // pages reserved by admitted sequences and not yet taken
  Generator::PageUse& use_;
};

/// A paged step's inputs: tokens [written, written + t_count) of each sequence of `batch` (its
/// pages taken), their positions, the cache slots they are written at, and the block table.
backend::TensorMap paged_step_inputs(const std::vector<PagedSequence*>& batch, std::int64_t t_count, std::int64_t page_size) {
  const auto b_count = static_cast<std::int64_t>(batch.size());
  std::int64_t widest = 0;
  for (const PagedSequence* s : batch) widest = std::max(widest, static_cast<std::int64_t>(s->pages.size()));
  Tensor ids(DType::i32, {b_count, t_count}), positions(DType::i32, {b_count, t_count}), slots(DType::i32, {b_count, t_count}),
      table(DType::i32, {b_count, widest});
  for (std::int64_t b = 0; b < b_count; ++b) {
    const PagedSequence& s = *batch[static_cast<std::size_t>(b)];
    for (std::int64_t t = 0; t < t_count; ++t) {
      const std::int64_t position = s.written + t;
      ids.data<std::int32_t>()[b * t_count + t] = s.tokens[static_cast<std::size_t>(position)];
      positions.data<std::int32_t>()[b * t_count + t] = static_cast<std::int32_t>(position);
      slots.data<std::int32_t>()[b * t_count + t] =
          static_cast<std::int32_t>(s.pages[static_cast<std::size_t>(position / page_size)] * page_size + position % page_size);
    }
    for (std::int64_t j = 0; j < widest; ++j)
      table.data<std::int32_t>()[b * widest + j] = j < static_cast<std::int64_t>(s.pages.size()) ? s.pages[static_cast<std::size_t>(j)] : -1;
  }
  return {
      {"input_ids", std::move(ids)}, {"position_ids", std::move(positions)}, {"cache_slots", std::move(slots)}, {"block_table", std::move(table)}};
}

/// A step's logits [B, 1, V] in f32: the output itself, or widened into `widened`.
const Tensor& f32_logits(const backend::TensorMap& outputs, Tensor& widened) {
  const Tensor& logits = outputs.at("logits");
  if (logits.dtype() == DType::f32) return logits;
  return widened = logits.to(DType::f32);
}

/// Throws UsageError when a prompt and max_new_tokens exceed the model's positions or could need
/// more pages than the cache has (checked before anything runs: an admitted sequence never waits
/// for a page).
void check_paged_fit(const std::vector<std::vector<std::int32_t>>& prompts, std::int64_t new_tokens, std::int64_t positions,
                     const CachePages& cache) {
  for (const auto& prompt : prompts) {
    const auto length = static_cast<std::int64_t>(prompt.size());
    const std::int64_t need = (length + new_tokens + cache.page_size - 1) / cache.page_size;
    if (length + new_tokens > positions)
      throw UsageError("generate: a prompt of " + std::to_string(length) + " tokens and " + std::to_string(new_tokens) +
                       " new ones exceed the model's " + std::to_string(positions) + " positions");
    if (need > cache.pages)
      throw UsageError("generate: a prompt of " + std::to_string(length) + " tokens and " + std::to_string(new_tokens) + " new ones need " +
                       std::to_string(need) + " pages of " + std::to_string(cache.page_size) + " positions; the cache has " +
                       std::to_string(cache.pages));
  }
}

}  // namespace

std::vector<std::vector<std::int32_t>> Generator::generate_paged(const std::vector<std::vector<std::int32_t>>& prompts, const GenerationOptions& o,
                                                                 const std::function<bool(std::size_t, std::int32_t)>& on_token) {
  const CachePages& cache = *pages_;
  check_prompts(prompts, model_.vocab_size);
  if (o.max_new_tokens < 0) throw UsageError("generate: max_new_tokens is negative");
  check_paged_fit(prompts, o.max_new_tokens, max_length_, cache);
  std::vector<std::int64_t> stop = o.stop_tokens;
  if (o.use_model_stop_tokens) stop.insert(stop.end(), model_.eos_token_ids.begin(), model_.eos_token_ids.end());
  std::vector<std::vector<std::int32_t>> out(prompts.size());
  page_use_ = {};
  if (o.max_new_tokens == 0) return out;
  PagePool pool(cache, page_use_);

  // One step: tokens [from, from + T) of each sequence, written at their slots; the last
  // position's logits of each, [B, V], valid until the next step (written into the last step's
  // outputs where their shape allows: a decode step allocates no logits).
  backend::TensorMap outputs;
  Tensor widened;
  auto step = [&](const std::vector<PagedSequence*>& batch, std::int64_t t_count) -> const Tensor& {
    for (PagedSequence* s : batch) pool.take(*s, s->written + t_count);
    exe_->run_into(paged_step_inputs(batch, t_count, cache.page_size), outputs);
    for (PagedSequence* s : batch) s->written += t_count;
    return f32_logits(outputs, widened);
  };
  // Picks sequence s's next token from its row of logits; whether it goes on.
  auto pick = [&](PagedSequence& s, const float* row) {
    Sampling sampling = o.sampling;
    sampling.seed += static_cast<std::uint64_t>(s.index);
    const std::int32_t next = pick_token(row, model_.vocab_size, sampling, static_cast<std::uint64_t>(s.produced));
    out[s.index].push_back(next);
    s.tokens.push_back(next);
    ++s.produced;
    const bool go_on = !on_token || on_token(s.index, next);
    return go_on && s.produced < o.max_new_tokens && std::find(stop.begin(), stop.end(), next) == stop.end();
  };

  std::vector<PagedSequence> sequences(prompts.size());
  std::size_t next_prompt = 0;
  std::vector<PagedSequence*> active;
  const std::int64_t chunk = o.prefill_chunk > 0 ? o.prefill_chunk : max_length_;
  while (next_prompt < prompts.size() || !active.empty()) {
    // Admits the next prompts while the free pages cover what each may come to hold, prefilling
    // each alone (its prompt in chunks) and picking its first token.
    while (next_prompt < prompts.size()) {
      PagedSequence& s = sequences[next_prompt];
      const auto length = static_cast<std::int64_t>(prompts[next_prompt].size());
      if (!pool.admit(s, length + o.max_new_tokens)) break;
      s.index = next_prompt++;
      s.tokens = prompts[s.index];
      Tensor logits;
      while (s.written < length) logits = step({&s}, std::min(chunk, length - s.written));
      if (pick(s, std::as_const(logits).data<float>())) active.push_back(&s);
      else pool.give_back(s);
    }
    if (active.empty()) continue;
    // A decode step of every admitted sequence: its last token in.
    page_use_.peak_batch = std::max(page_use_.peak_batch, static_cast<std::int64_t>(active.size()));
    const Tensor& rows = step(active, 1);
    std::vector<PagedSequence*> going_on;
    for (std::size_t b = 0; b < active.size(); ++b) {
      if (pick(*active[b], std::as_const(rows).data<float>() + static_cast<std::int64_t>(b) * model_.vocab_size)) going_on.push_back(active[b]);
      else pool.give_back(*active[b]);
    }
    active = std::move(going_on);
  }
  return out;
}

std::vector<std::int32_t> Generator::generate(const std::vector<std::int32_t>& prompt, const GenerationOptions& o,
                                              const std::function<bool(std::int32_t)>& on_token) {
  if (!pages_ && batch_ != 1) throw UsageError("generate: one prompt given to a generator of " + std::to_string(batch_) + " sequences");
  auto each = [&](std::size_t, std::int32_t id) { return !on_token || on_token(id); };
  return generate(std::vector<std::vector<std::int32_t>>{prompt}, o, each)[0];
}

std::vector<std::vector<std::int32_t>> Generator::generate(const std::vector<std::vector<std::int32_t>>& prompts, const GenerationOptions& o,
                                                           const std::function<bool(std::size_t, std::int32_t)>& on_token) {
  if (pages_) return generate_paged(prompts, o, on_token);
  if (static_cast<std::int64_t>(prompts.size()) != batch_)
    throw UsageError("generate: " + std::to_string(prompts.size()) + " prompts given to a generator of " + std::to_string(batch_) + " sequences");
  check_prompts(prompts, model_.vocab_size);
  std::int64_t longest = 0;
  for (const auto& prompt : prompts) longest = std::max(longest, static_cast<std::int64_t>(prompt.size()));
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
  // One step: ids and positions [B, T] into slots [slot, slot + T); each sequence's last logits,
  // valid until the next step (written into the last step's outputs, as above).
  backend::TensorMap outputs;
  Tensor widened;
  auto step = [&](const Tensor& step_ids, const Tensor& step_positions) -> const Tensor& {
    Tensor start = Tensor::from<std::int32_t>({}, {static_cast<std::int32_t>(slot)});
    exe_->run_into({{"input_ids", step_ids}, {"position_ids", step_positions}, {"cache_start", start}, {"cache_first", first}}, outputs);
    slot += step_ids.shape()[1];
    return f32_logits(outputs, widened);
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
    const Tensor& rows = step(ids, positions);
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
