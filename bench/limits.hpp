// The machine's limits, measured in the process that measures the rows: the fused multiply-add
// peak of the widest vector ISA (per thread count) for rows bound by arithmetic, and the read
// bandwidth from memory for rows bound by it. Every table prints its rows as fractions of these.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backends/cpu/isa.hpp"
#include "backends/cpu/thread_pool.hpp"

namespace qkv::bench {

namespace detail {

using Clock = std::chrono::steady_clock;

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

/// `rounds` x 2 x A fused multiply-adds of V in A independent chains (more chains than the FMA
/// units' latency times their count, so the loop runs at their throughput); returns a value that
/// depends on all of them.
template <class V, int A> [[gnu::always_inline]] inline float fma_chains(std::int64_t rounds) {
  V acc[A], x = V{} + 1.0000001f, y = V{} + 0.9999999f;
#pragma GCC unroll 16
  for (int a = 0; a < A; ++a) acc[a] = V{} + static_cast<float>(a);
  for (std::int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
    for (int a = 0; a < A; ++a) acc[a] = acc[a] * x + y;
#pragma GCC unroll 16
    for (int a = 0; a < A; ++a) acc[a] = acc[a] * y + x;
    __asm__ volatile("" : "+x"(x), "+x"(y));  // keeps the multipliers opaque (no constant folding)
  }
  float total = 0;
  for (const V& v : acc) total += v[0];
  return total;
}

using v4f = float __attribute__((vector_size(16)));
using v8f = float __attribute__((vector_size(32)));
using v16f = float __attribute__((vector_size(64)));

#if defined(__x86_64__)
// The widest loads the CPU has: on AVX-512 machines 64-byte loads read memory faster than 32-byte ones.
__attribute__((target("arch=x86-64-v4"))) inline float sum_avx512(const float* p, std::size_t n) { return sum_with<v16f>(p, n); }
__attribute__((target("arch=x86-64-v3"))) inline float sum_avx2(const float* p, std::size_t n) { return sum_with<v8f>(p, n); }
__attribute__((target("arch=x86-64-v4"))) inline float fma_avx512(std::int64_t rounds) { return fma_chains<v16f, 12>(rounds); }
__attribute__((target("arch=x86-64-v3"))) inline float fma_avx2(std::int64_t rounds) { return fma_chains<v8f, 10>(rounds); }
#endif

inline float sum_of(const float* p, std::size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("x86-64-v4")) return sum_avx512(p, n);
  if (__builtin_cpu_supports("x86-64-v3")) return sum_avx2(p, n);
#endif
  return sum_with<v4f>(p, n);
}

}  // namespace detail

/// FLOPs (a fused multiply-add is two) of one vector FMA chain step on the ISA the cpu kernels
/// use (backend::cpu::host_isa(), so QKV_CPU_ISA caps the peak as it caps the kernels), per
/// second, summed over `threads` threads of the backend's pool running at once. Best of 5.
inline double fma_peak_flops(int threads) {
  using namespace detail;
  using backend::cpu::Isa;
  const Isa isa = backend::cpu::host_isa();
  const std::int64_t rounds = 1 << 22;
  const int chains = isa == Isa::avx512 ? 12 : 10, lanes = isa == Isa::avx512 ? 16 : isa == Isa::avx2 ? 8 : 4;
  auto run = [&]() -> float {
#if defined(__x86_64__)
    if (isa == Isa::avx512) return fma_avx512(rounds);
    if (isa == Isa::avx2) return fma_avx2(rounds);
#endif
    return fma_chains<v4f, 10>(rounds);  // the baseline ISA has no FMA: a multiply and an add
  };
  auto& pool = backend::cpu::ThreadPool::global();
  std::vector<float> sink(static_cast<std::size_t>(threads));
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    if (threads == 1) sink[0] = run();
    else pool.parallel_for(threads, [&](std::int64_t t) { sink[static_cast<std::size_t>(t)] = run(); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(rounds) * 2 * chains * 2 * lanes * threads / s);
  }
  if (sink[0] == 12345.0f) std::printf("fma_peak: unlikely sum\n");
  return best;
}

/// Bytes read per second by a sum over a buffer far larger than the caches, one contiguous part
/// per thread of the backend's pool: what a pass over weights and cache can reach at best.
inline double read_bandwidth() {
  using namespace detail;
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

}  // namespace qkv::bench
