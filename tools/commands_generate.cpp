// qkv generate: text from a model folder, streamed as it is produced.
#include <chrono>
#include <cmath>
#include <cstdio>

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
  const std::vector<std::int32_t> prompt = tokenizer.encode(f.prompt);
  if (prompt.empty()) throw UsageError("--prompt: the tokenizer gives no tokens for it (give some text)");
  const std::int64_t length =
      std::min<std::int64_t>(model.max_positions, static_cast<std::int64_t>(prompt.size()) + std::min(f.max_tokens, model.max_positions));
  if (static_cast<std::int64_t>(prompt.size()) >= length)
    throw UsageError("--prompt: " + std::to_string(prompt.size()) + " tokens leave no room in the model's " + std::to_string(model.max_positions) +
                     " positions");
  auto backend = backend::create(f.backend);
  models::Generator generator(model, *backend, length);
  models::GenerationOptions o;
  o.max_new_tokens = length - static_cast<std::int64_t>(prompt.size());
  o.use_model_stop_tokens = !f.ignore_eos;
  o.sampling = {f.temperature, f.top_k, f.top_p, f.seed};
  // The prompt as the tokenizer reads it back, then each piece of text as soon as it is whole.
  std::fputs(tokenizer.decode(prompt, true).c_str(), stdout);
  std::fflush(stdout);
  io::TextStream stream(tokenizer);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  Clock::time_point first;
  std::int64_t produced = 0;
  generator.generate(prompt, o, [&](std::int32_t id) {
    if (produced++ == 0) first = Clock::now();
    std::fputs(stream.push(id).c_str(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputs((stream.finish() + "\n").c_str(), stdout);
  std::fflush(stdout);  // the text before the figures, where both go to one pipe
  const double prefill = std::chrono::duration<double>(first - start).count();
  const double decode = std::chrono::duration<double>(Clock::now() - first).count();
  std::fprintf(stderr, "qkv: %zu prompt tokens in %.1f ms (prefill), %lld new tokens, %.1f tokens/s decoding, on %s\n", prompt.size(), prefill * 1e3,
               static_cast<long long>(produced), produced > 1 ? static_cast<double>(produced - 1) / decode : 0.0, backend->name().c_str());
  return 0;
}

}  // namespace qkv::tool
