// The counter-based generator behind dropout_mask: Philox4x32-10 (Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3", SC 2011). A pure function of (key, counter), so every
// backend, the GLSL generator included, computes the same bits for the same element in any order.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace qkv::ir {

inline constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
inline constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
/// The second key word of dropout masks (the first is the seed).
inline constexpr std::uint32_t kDropoutKey1 = 0x71B7C0DEu;

/// Philox4x32 with 10 rounds.
constexpr std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> c, std::array<std::uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kPhiloxM0) * c[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kPhiloxM1) * c[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k = {k[0] + kPhiloxW0, k[1] + kPhiloxW1};
  }
  return c;
}

/// dropout_mask's seeds lie in [0, 2^24): backends that hold numbers as f32 keep them exactly.
inline constexpr std::int64_t kDropoutSeedLimit = std::int64_t{1} << 24;
constexpr bool dropout_seed_ok(double seed) {
  return seed >= 0 && seed < static_cast<double>(kDropoutSeedLimit) && seed == static_cast<double>(static_cast<std::int64_t>(seed));
}

/// The 32-bit threshold below which an element is dropped: floor(p * 2^32), p in [0, 1).
inline std::uint32_t dropout_threshold(double p) {
  const double t = std::floor(std::ldexp(p, 32));
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(t);
}

/// The value a kept element of a dropout mask takes: 1/(1-p) (inverted dropout), p in [0, 1).
constexpr double dropout_keep_value(double p) { return 1.0 / (1.0 - p); }

/// Whether element `index` of a dropout mask with `seed` survives: the first word of
/// philox(counter = (index, 0, 0, 0), key = (seed, kDropoutKey1)) >= threshold.
constexpr bool dropout_keeps(std::uint32_t seed, std::uint32_t index, std::uint32_t threshold) {
  return philox4x32_10({index, 0u, 0u, 0u}, {seed, kDropoutKey1})[0] >= threshold;
}

}  // namespace qkv::ir
