// Decode speed of a real architecture against the machine's limit: GPT-2 small's shape (124M
// parameters, random weights), one-token decode steps against a key/value cache of P tokens.
// Decoding is bound by memory: each token reads every weight and the cache once, so the bound is
// (weight bytes + cache bytes) / the read bandwidth measured in the same run. Also the prefill of
// 512 tokens and peak resident memory against weights plus cache.
//
//   build/default/bench/qkv_decode_bench [--backend cpu] [--steps 16] [--repeat 3]
//   python3 bench/torch_decode.py        (transformers on PyTorch, the same shapes, for the peer row)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "models/generate.hpp"
#include "models/gpt2.hpp"

namespace {

using namespace qkv;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Floats [0, n) of p summed with four vector accumulators of V: a loop bound by its loads.
template <class V> [[gnu::always_inline]] inline float sum_with(const float* p, std::size_t n) {
  constexpr std::size_t lanes = sizeof(V) / sizeof(float);
  V s[4] = {};
  for (std::size_t i = 0; i + 4 * lanes <= n; i += 4 * lanes)
    for (std::size_t j = 0; j < 4; ++j) {
      V v;
      std::memcpy(&v, p + i + lanes * j, sizeof v);
      s[j] += v;
    }
  float total = 0;
  for (const V& v : s)
    for (std::size_t l = 0; l < lanes; ++l) total += v[l];
  return total;
}
#if defined(__x86_64__)
// The widest loads the CPU has: on AVX-512 machines 64-byte loads read memory faster than 32-byte ones.
__attribute__((target("arch=x86-64-v4"))) float sum_avx512(const float* p, std::size_t n) { return sum_with<float __attribute__((vector_size(64)))>(p, n); }
__attribute__((target("arch=x86-64-v3"))) float sum_avx2(const float* p, std::size_t n) { return sum_with<float __attribute__((vector_size(32)))>(p, n); }
float sum_of(const float* p, std::size_t n) {
  if (__builtin_cpu_supports("x86-64-v4")) return sum_avx512(p, n);
  if (__builtin_cpu_supports("x86-64-v3")) return sum_avx2(p, n);
  return sum_with<float __attribute__((vector_size(16)))>(p, n);
}
#else
float sum_of(const float* p, std::size_t n) { return sum_with<float __attribute__((vector_size(16)))>(p, n); }
#endif

/// Bytes read per second by a sum over a buffer far larger than the caches, one contiguous part
/// per thread: what a decode step's reads of weights and cache can reach at best.
double read_bandwidth() {
  const std::size_t floats = std::size_t{128} << 20;  // 512 MB
  std::vector<float> a(floats, 1.0f);
  auto& pool = backend::cpu::ThreadPool::global();
  const std::int64_t parts = pool.size();
  std::vector<float> sums(static_cast<std::size_t>(parts));
  std::vector<double> rates;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = Clock::now();
    pool.parallel_for(parts, [&](std::int64_t c) {
      const std::size_t part = floats / static_cast<std::size_t>(parts);
      sums[static_cast<std::size_t>(c)] = sum_of(a.data() + static_cast<std::size_t>(c) * part, part);
    });
    rates.push_back(static_cast<double>(floats * 4) / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (sums[0] != static_cast<float>(floats / static_cast<std::size_t>(parts))) std::printf("read_bandwidth: wrong sum\n");
  return *std::max_element(rates.begin(), rates.end());
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend_name = "cpu";
  int steps = 16, repeat = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--backend") backend_name = argv[i + 1];
    else if (flag == "--steps") steps = std::stoi(argv[i + 1]);
    else if (flag == "--repeat") repeat = std::stoi(argv[i + 1]);
  }
  // GPT-2 small, with 2048 positions so that a cache of 2048 fits.
  models::Gpt2Config c{};
  c.vocab_size = 50257, c.n_positions = 2048, c.n_embd = 768, c.n_layer = 12, c.n_head = 12;
  const models::Gpt2LMHeadModel module = models::make_gpt2(c);
  models::Pretrained m;
  m.model_type = "gpt2";
  m.parameters = models::named_parameters(module);
  m.step_graph = models::gpt2_step_graph(module, c);
  m.vocab_size = c.vocab_size, m.max_positions = c.n_positions, m.layers = c.n_layer, m.kv_heads = c.n_head, m.head_dim = c.n_embd / c.n_head;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::int64_t weight_bytes = 0;
  for (const auto& [name, shape] : m.parameters) {
    Tensor t(DType::f32, shape);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
    weight_bytes += t.numel() * 4;
    m.weights.emplace(name, std::move(t));
  }
  auto backend = backend::create(backend_name);
  const double bandwidth = read_bandwidth();
  std::printf("GPT-2 small shape (%.1fM parameters, f32, random weights) on %s\n", static_cast<double>(weight_bytes) / 4e6,
              backend->device().c_str());
  std::printf("read bandwidth %.1f GB/s (the best of 7 parallel sums of 512 MB); medians of %d runs of %d decode steps\n\n", bandwidth / 1e9, repeat, steps);
  std::printf("| cache P | tokens/s | ms/token | bound tokens/s | of bound |\n|---|---|---|---|---|\n");
  for (const std::int64_t cache : {std::int64_t{128}, 2048 - std::int64_t{steps} - 1}) {
    models::Generator gen(m, *backend, cache + steps + 1);
    std::vector<double> rates;
    for (int r = 0; r < repeat; ++r) {
      std::vector<std::int32_t> prompt(static_cast<std::size_t>(cache));
      for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>((i * 7919) % 50257);
      models::GenerationOptions o;
      o.max_new_tokens = steps + 1;
      o.use_model_stop_tokens = false;
      Clock::time_point first;
      int seen = 0;
      gen.generate(prompt, o, [&](std::int32_t) {
        if (seen++ == 0) first = Clock::now();  // after the prefill and the first token
        return true;
      });
      rates.push_back(steps / std::chrono::duration<double>(Clock::now() - first).count());
    }
    const double rate = median(rates);
    // Per token: every weight once, and the cache's keys and values of P tokens.
    const double bytes = static_cast<double>(weight_bytes) + 2.0 * static_cast<double>(c.n_layer * cache * c.n_embd * 4);
    const double bound = bandwidth / bytes;
    std::printf("| %lld | %.1f | %.1f | %.1f | %.0f%% |\n", static_cast<long long>(cache), rate, 1e3 / rate, bound, 100 * rate / bound);
  }
  // Prefill of 512 tokens.
  {
    models::Generator gen(m, *backend, 513);
    std::vector<double> times;
    std::vector<std::int32_t> prompt(512);
    for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>((i * 7919) % 50257);
    for (int r = 0; r < repeat; ++r) {
      models::GenerationOptions o;
      o.max_new_tokens = 1;
      o.use_model_stop_tokens = false;
      const auto t0 = Clock::now();
      gen.generate(prompt, o);
      times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::printf("\nprefill of 512 tokens: %.1f ms (%.0f tokens/s)\n", median(times) * 1e3, 512 / median(times));
  }
  const double cache_mb = 2.0 * static_cast<double>(c.n_layer * c.n_positions * c.n_embd * 4) / 1e6;
  std::printf("peak resident memory: %.0f MB; weights %.0f MB + largest cache %.0f MB = %.0f MB (%.2fx)\n", peak_rss_mb(),
              static_cast<double>(weight_bytes) / 1e6, cache_mb, static_cast<double>(weight_bytes) / 1e6 + cache_mb,
              peak_rss_mb() / (static_cast<double>(weight_bytes) / 1e6 + cache_mb));
  return 0;
}
