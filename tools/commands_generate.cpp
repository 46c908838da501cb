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
  models::Generator generator(model, *backend, length, batch);
  models::GenerationOptions o;
  o.max_new_tokens = length - static_cast<std::int64_t>(longest);
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
  std::fprintf(stderr, "qkv: %zu prompt tokens in %.1f ms (prefill%s), %lld new tokens, %.1f tokens/s decoding, on %s\n",
               batch == 1 ? prompts[0].size() : static_cast<std::size_t>(batch) * longest, prefill * 1e3,
               batch == 1 ? "" : (", " + std::to_string(batch) + " sequences padded to " + std::to_string(longest)).c_str(),
               static_cast<long long>(produced), produced > batch ? static_cast<double>(produced - batch) / decode : 0.0, backend->name().c_str());
  return 0;
}

}  // namespace qkv::tool
