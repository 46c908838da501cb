// qkv generate: text from a model folder, streamed as it is produced.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "io/tokenizer.hpp"
#include "models/generate.hpp"
#include "models/pretrained.hpp"
#include "tools/commands.hpp"

namespace qkv::tool {

int cmd_generate(const GenerateFlags& f) {
  if (!models::is_model_dir(f.model)) throw UsageError(f.model + ": not a model folder (a folder with config.json, as transformers saves one)");
  if (f.max_tokens < 1) throw UsageError("--max-tokens " + std::to_string(f.max_tokens) + ": at least 1");
  if (!(f.temperature >= 0) || !std::isfinite(f.temperature)) throw UsageError("--temperature: a number, at least 0 (0 picks the most likely token)");
  if (!(f.top_p > 0 && f.top_p <= 1)) throw UsageError("--top-p: in (0, 1]");
  if (f.top_k < 0) throw UsageError("--top-k: at least 0 (0: every token)");
  if (f.page_size < -1) throw UsageError("--page-size " + std::to_string(f.page_size) + ": at least 0 (0: a contiguous cache)");
  if (f.cache_pages < 0) throw UsageError("--cache-pages " + std::to_string(f.cache_pages) + ": at least 0 (0: as many as the prompts need)");
  const models::Pretrained model = models::load_pretrained(f.model);
  if (model.step_graph.size() == 0)
    throw UsageError(f.model + ": a " + model.model_type +
                     " model does not generate text (decoders such as gpt2 and llama do; qkv embed reads encoders)");
  const io::Tokenizer tokenizer = io::Tokenizer::from_folder(f.model);
  std::vector<std::vector<std::int32_t>> prompts;
  std::size_t longest = 0;
  for (const std::string& text : f.prompts) {
    prompts.push_back(tokenizer.encode(text));
    if (prompts.back().empty()) throw UsageError("--prompt \"" + text + "\": the tokenizer gives no tokens for it (give some text)");
    longest = std::max(longest, prompts.back().size());
  }
  const std::int64_t length =
      std::min<std::int64_t>(model.max_positions, static_cast<std::int64_t>(longest) + std::min(f.max_tokens, model.max_positions));
  if (static_cast<std::int64_t>(longest) >= length)
    throw UsageError("--prompt: " + std::to_string(longest) + " tokens leave no room in the model's " + std::to_string(model.max_positions) +
                     " positions");
  auto backend = backend::create(f.backend);
  const auto batch = static_cast<std::int64_t>(prompts.size());
  // Paged by default where attention reads the pages in place (cpu and vulkan); the reference
  // runs the meaning, gathering them for each step, where a contiguous cache reads less.
  const std::int64_t page_size = f.page_size >= 0 ? f.page_size : backend->name() == "reference" ? 0 : 16;
  models::GenerationOptions o;
  o.max_new_tokens = length - static_cast<std::int64_t>(longest);
  // Enough pages for every prompt and its new tokens at once unless --cache-pages says fewer
  // (then prompts wait for pages others give back).
  models::CachePages pages{f.cache_pages, page_size};
  for (const auto& p : prompts) {
    if (page_size == 0) break;
    const std::int64_t need = (static_cast<std::int64_t>(p.size()) + o.max_new_tokens + page_size - 1) / page_size;
    if (f.cache_pages == 0) pages.pages += need;
    else if (need > f.cache_pages)  // before anything is printed
      throw UsageError("--cache-pages " + std::to_string(f.cache_pages) + ": a prompt of " + std::to_string(p.size()) + " tokens and " +
                       std::to_string(o.max_new_tokens) + " new ones need " + std::to_string(need) + " pages of " + std::to_string(page_size) +
                       " positions");
  }
  models::Generator generator = page_size > 0 ? models::Generator(model, *backend, pages) : models::Generator(model, *backend, length, batch);
  o.use_model_stop_tokens = !f.ignore_eos;
  o.sampling = {f.temperature, f.top_k, f.top_p, f.seed};
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Clock::time_point first;
  std::int64_t produced = 0;  // tokens of every sequence (the first step's, one per sequence, come with the prefill)
  if (batch == 1) {
    // The prompt as the tokenizer reads it back, then each piece of text as soon as it is whole.
    std::fputs(tokenizer.decode(prompts[0], true).c_str(), stdout);
    std::fflush(stdout);
    io::TextStream stream(tokenizer);
    generator.generate(prompts[0], o, [&](std::int32_t id) {
      if (produced++ == 0) first = Clock::now();
      std::fputs(stream.push(id).c_str(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputs((stream.finish() + "\n").c_str(), stdout);
  } else {
    // A batch: each continuation printed whole once every sequence has ended, in prompt order.
    const auto out = generator.generate(prompts, o, [&](std::size_t, std::int32_t) {
      if (produced++ == 0) first = Clock::now();
      return true;
    });
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::fputs(((i ? "\n" : "") + tokenizer.decode(prompts[i], true) + tokenizer.decode(out[i], true) + "\n").c_str(), stdout);
    }
  }
  std::fflush(stdout);  // the text before the figures, where both go to one pipe
  const double prefill = std::chrono::duration<double>(first - start).count();
  const double decode = std::chrono::duration<double>(Clock::now() - first).count();
  std::size_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += p.size();
  std::string layout;
  if (generator.pages()) {
    const auto& use = generator.page_use();
    layout = ", paged cache: at most " + std::to_string(use.peak_pages) + " of its " + std::to_string(pages.pages) + " pages of " +
             std::to_string(pages.page_size) + " positions in use, " + std::to_string(use.reused_pages) + " taken again; up to " +
             std::to_string(use.peak_batch) + (use.peak_batch == 1 ? " sequence" : " sequences") + " a decode step";
  } else if (batch > 1) {
    layout = ", " + std::to_string(batch) + " sequences padded to " + std::to_string(longest);
    prompt_tokens = static_cast<std::size_t>(batch) * longest;
  }
  // With a paged cache the prompts are prefilled one by one as they are admitted: the first
  // token comes after the first prompt's prefill, and the later prefills run among the decode steps.
  const char* timing = generator.pages() ? "qkv: %zu prompt tokens, the first token after %.1f ms%s, %lld new tokens, %.1f tokens/s after it, on %s\n"
                                         : "qkv: %zu prompt tokens in %.1f ms (prefill%s), %lld new tokens, %.1f tokens/s decoding, on %s\n";
  std::fprintf(stderr, timing, prompt_tokens, prefill * 1e3, layout.c_str(), static_cast<long long>(produced),
               produced > batch ? static_cast<double>(produced - batch) / decode : 0.0, backend->name().c_str());
  return 0;
}

}  // namespace qkv::tool
