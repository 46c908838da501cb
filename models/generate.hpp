// Text generation with a key/value cache: the cache allocated once for the longest sequence and
// held by the backend, a prefill of the prompt, then one-token decode steps, each writing its key
// and value into the cache in place; greedy choice or seeded sampling (temperature, top-k,
// top-p), stop tokens and a token limit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "backends/backend.hpp"
#include "models/pretrained.hpp"

namespace qkv::models {

/// How the next token is picked from the logits: greedy (temperature 0, the first largest, as
/// torch.argmax), or sampled from softmax(logits / temperature) restricted to the top_k largest
/// (0: all) and then to the smallest set whose probability reaches top_p, in transformers'
/// order; `seed` makes sampling repeatable.
struct Sampling {
  double temperature = 0.0;
  std::int64_t top_k = 0;
  double top_p = 1.0;
  std::uint64_t seed = 0;
};

struct GenerationOptions {
  std::int64_t max_new_tokens = 32;
  /// Tokens that end the generation (kept in the output); the model's eos_token_id by default.
  std::vector<std::int64_t> stop_tokens;
  bool use_model_stop_tokens = true;
  Sampling sampling;
  /// The prompt goes through the model in steps of at most this many positions (0: at once), each
  /// writing its keys and values into the cache: a long prompt's activations are those of a
  /// chunk, not of the whole prompt (chunked prefill), for the same result.
  std::int64_t prefill_chunk = 512;
};

/// A paged key/value cache: `pages` pages of `page_size` positions, shared by the sequences a
/// generator continues. Each sequence takes pages as it grows (nothing of it is copied when it
/// does) and gives them back when it ends, for the next to take.
struct CachePages {
  std::int64_t pages = 256;
  std::int64_t page_size = 16;
};

/// The next token from one row of logits [vocab].
std::int32_t pick_token(const float* logits, std::int64_t vocab, const Sampling& s, std::uint64_t step);

class Generator {
 public:
  /// Compiles the model's step graph on `backend` and holds its weights and a zero cache for
  /// `batch` sequences of `max_length` positions (prompt and new tokens; at most the model's).
  Generator(const Pretrained& model, backend::Backend& backend, std::int64_t max_length, std::int64_t batch = 1);
  Generator(Pretrained&&, backend::Backend&, std::int64_t, std::int64_t = 1) = delete;  // keeps a reference to the model
  /// Compiles the model's paged step graph and holds its weights and a zero cache of `cache`'s
  /// pages, which any number of prompts share: generate() admits prompts in order while the free
  /// pages cover each one's prompt and max_new_tokens (continuous batching: a prompt waits for a
  /// sequence to end and give its pages back), prefills each alone and decodes all admitted
  /// sequences together, each step reading their keys and values through their block tables.
  Generator(const Pretrained& model, backend::Backend& backend, CachePages cache);
  Generator(Pretrained&&, backend::Backend&, CachePages) = delete;
  /// The prompt's continuation (a generator of batch 1): the new tokens, each passed to
  /// `on_token` as soon as it is picked (which may return false to stop). Throws UsageError
  /// when the prompt and max_new_tokens do not fit max_length, or the prompt is empty.
  std::vector<std::int32_t> generate(const std::vector<std::int32_t>& prompt, const GenerationOptions& o,
                                     const std::function<bool(std::int32_t)>& on_token = {});
  /// The continuations of prompts of any lengths, each step reading the weights once for all the
  /// sequences it continues: with a contiguous cache `batch` prompts at once, the shorter padded
  /// on the left (their padding never seen, their positions counting from their first token), as
  /// transformers' generate pads them; with a paged cache any number, as the pages admit them.
  /// Each sequence ends at a stop token or after max_new_tokens; `on_token(sequence, token)` sees
  /// each new token (false stops that sequence). Sequence i samples with seed o.sampling.seed + i.
  std::vector<std::vector<std::int32_t>> generate(const std::vector<std::vector<std::int32_t>>& prompts, const GenerationOptions& o,
                                                  const std::function<bool(std::size_t, std::int32_t)>& on_token = {});
  /// The executable that runs the steps (its plan, its held state).
  backend::Executable& executable() { return *exe_; }
  /// The paged cache's size, when the generator has one.
  const std::optional<CachePages>& pages() const { return pages_; }
  /// What the last generate() did with a paged cache: the most pages its sequences held at once,
  /// the most sequences decoded together, and the pages it took from those others gave back.
  struct PageUse {
    std::int64_t peak_pages = 0, peak_batch = 0, reused_pages = 0;
  };
  const PageUse& page_use() const { return page_use_; }

 private:
  std::vector<std::vector<std::int32_t>> generate_paged(const std::vector<std::vector<std::int32_t>>& prompts, const GenerationOptions& o,
                                                        const std::function<bool(std::size_t, std::int32_t)>& on_token);
  const Pretrained& model_;
  std::int64_t max_length_, batch_;
  std::optional<CachePages> pages_;
  PageUse page_use_;
  std::unique_ptr<backend::Executable> exe_;
};

}  // namespace qkv::models
