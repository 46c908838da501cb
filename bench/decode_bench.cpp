// Decode speed of a real architecture against the machine's limit: GPT-2 small's shape (124M
// parameters, random weights) saved as a model folder in f32 and in bf16 and loaded as any
// checkpoint is (mapped), one-token decode steps against a key/value cache of P tokens.
// Decoding is bound by memory: each token reads every weight and the cache once, so the bound is
// (weight bytes + cache bytes) / the read bandwidth measured in the same run. Also the prefill of
// 512 tokens and peak resident memory against weights plus cache.
//
//   build/default/bench/qkv_decode_bench [--backend cpu] [--steps 16] [--repeat 3] [--weights f32|bf16] [--prefill-only 1]
//   python3 bench/torch_decode.py        (transformers on PyTorch, the same shapes, for the peer row)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "bench/limits.hpp"
#include "io/safetensors.hpp"
#include "models/generate.hpp"
#include "models/gpt2.hpp"
#include "models/pretrained.hpp"

namespace {

using namespace qkv;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

/// GPT-2 small's shape with 2048 positions (so that a cache of 2048 fits) and random weights,
/// saved as transformers would in `dir`/f32 and `dir`/bf16.
void write_checkpoints(const std::filesystem::path& dir) {
  models::Gpt2Config c{};
  c.vocab_size = 50257, c.n_positions = 2048, c.n_embd = 768, c.n_layer = 12, c.n_head = 12;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  io::TensorFile f32, bf16;
  for (const auto& [name, shape] : models::named_parameters(models::make_gpt2(c))) {
    Tensor t = Tensor::uninitialized(DType::f32, shape);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
    bf16.emplace(name, t.to(DType::bf16));
    f32.emplace(name, std::move(t));
  }
  for (const auto& [folder, weights] : {std::pair{"f32", &f32}, std::pair{"bf16", &bf16}}) {
    std::filesystem::create_directories(dir / folder);
    std::ofstream(dir / folder / "config.json") << R"({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 2048, "n_embd": 768,)"
                                                << R"( "n_layer": 12, "n_head": 12, "layer_norm_epsilon": 1e-05})";
    io::write_safetensors((dir / folder / "model.safetensors").string(), *weights);
  }
}

std::vector<std::int32_t> prompt_of(std::int64_t length) {
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(length));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>((i * 7919) % 50257);
  return prompt;
}

/// Decode tokens/s after a prompt of `cache` tokens: the median over `repeat` generations of the
/// steps after the first new token (the prefill's).
double decode_rate(models::Generator& gen, std::int64_t cache, int steps, int repeat) {
  std::vector<double> rates;
  for (int r = 0; r < repeat; ++r) {
    models::GenerationOptions o;
    o.max_new_tokens = steps + 1;
    o.use_model_stop_tokens = false;
    Clock::time_point first;
    int seen = 0;
    gen.generate(prompt_of(cache), o, [&](std::int32_t) {
      if (seen++ == 0) first = Clock::now();  // after the prefill and the first token
      return true;
    });
    rates.push_back(steps / std::chrono::duration<double>(Clock::now() - first).count());
  }
  return median(rates);
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend_name = "cpu";
  int steps = 16, repeat = 3;
  std::string only;
  bool prefill_only = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--backend") backend_name = argv[i + 1];
    else if (flag == "--steps") steps = std::stoi(argv[i + 1]);
    else if (flag == "--repeat") repeat = std::stoi(argv[i + 1]);
    else if (flag == "--weights") only = argv[i + 1];                                   // f32 or bf16 alone (to profile one)
    else if (flag == "--prefill-only") prefill_only = argv[i + 1] == std::string("1");  // the f32 prefill alone (to profile it)
  }
  // The read bandwidth is measured and the checkpoints are written by a child process, so that
  // this one's peak resident memory is the decoding's alone.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("qkv_decode_bench_" + std::to_string(getpid()));
  if (const pid_t child = fork(); child == 0) {
    const double measured = bench::read_bandwidth();
    write_checkpoints(dir);
    std::ofstream(dir / "bandwidth") << measured;
    _exit(0);
  } else {
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "decode_bench: writing the checkpoints to %s failed\n", dir.c_str());
      return 1;
    }
  }
  auto backend = backend::create(backend_name);
  const std::int64_t n_layer = 12, n_embd = 768, positions = 2048;
  const std::int64_t caches[] = {128, positions - steps - 1};
  struct Row {
    const char* dtype;
    std::int64_t cache;
    double rate, weight_bytes;
  };
  std::vector<Row> rows;
  double peak_mb = 0, weights_mb = 0, prefill_s = 0;
  for (const char* dtype : {"f32", "bf16"}) {
    if (!only.empty() && only != dtype) continue;
    const models::Pretrained m = models::load_pretrained((dir / dtype).string());
    double weight_bytes = 0;
    for (const auto& [name, t] : m.weights) weight_bytes += static_cast<double>(t.nbytes());
    for (const std::int64_t cache : caches) {
      if (prefill_only) break;
      models::Generator gen(m, *backend, cache + steps + 1);
      rows.push_back({dtype, cache, decode_rate(gen, cache, steps, repeat), weight_bytes});
    }
    if (std::string(dtype) == "f32") {
      peak_mb = peak_rss_mb();  // f32 decoding at both cache lengths: weights, the largest cache and the plans
      weights_mb = weight_bytes / 1e6;
      // Prefill of 512 tokens.
      models::Generator gen(m, *backend, 513);
      std::vector<double> times;
      for (int r = 0; r < repeat; ++r) {
        models::GenerationOptions o;
        o.max_new_tokens = 1;
        o.use_model_stop_tokens = false;
        const auto t0 = Clock::now();
        gen.generate(prompt_of(512), o);
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      prefill_s = median(times);
    }
  }
  double bandwidth = 0;
  std::ifstream(dir / "bandwidth") >> bandwidth;
  std::filesystem::remove_all(dir);
  std::printf("GPT-2 small shape (%.1fM parameters, random weights, loaded from a model folder) on %s\n", weights_mb / 4, backend->device().c_str());
  std::printf("read bandwidth %.1f GB/s (the best of 7 parallel sums of 512 MB); medians of %d runs of %d decode steps\n\n", bandwidth / 1e9, repeat,
              steps);
  std::printf("| weights | cache P | tokens/s | ms/token | bound tokens/s | of bound |\n|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    // Per token: every weight once, and the cache's keys and values of P tokens (f32).
    const double bytes = r.weight_bytes + 2.0 * static_cast<double>(n_layer * r.cache * n_embd * 4);
    const double bound = bandwidth / bytes;
    std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.0f%% |\n", r.dtype, static_cast<long long>(r.cache), r.rate, 1e3 / r.rate, bound,
                100 * r.rate / bound);
  }
  for (std::size_t i = 0; i < 2 && rows.size() == 4; ++i)
    std::printf("bf16 / f32 at P = %lld: %.2fx\n", static_cast<long long>(rows[i].cache), rows[i + 2].rate / rows[i].rate);
  if (prefill_s == 0) return 0;  // --weights bf16: no f32 rows
  std::printf("\nprefill of 512 tokens (f32): %.1f ms (%.0f tokens/s)\n", prefill_s * 1e3, 512 / prefill_s);
  const double cache_mb = 2.0 * static_cast<double>(n_layer * positions * n_embd * 4) / 1e6;
  std::printf("peak resident memory decoding (f32): %.0f MB; weights %.0f MB + largest cache %.0f MB = %.0f MB (%.2fx)\n", peak_mb, weights_mb,
              cache_mb, weights_mb + cache_mb, peak_mb / (weights_mb + cache_mb));
  return 0;
}
