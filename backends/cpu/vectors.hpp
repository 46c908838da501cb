// The vector types the CPU kernels are written over (GCC vector extensions), and their loads and
// stores. Only for the kernels' own translation units, which compile each kernel once per ISA
// (backends/cpu/isa.hpp) and always inline these helpers into those copies.
#pragma once

#include <cstdint>
#include <cstring>

// The helpers return 32- and 64-byte vectors (and take them by reference); they are always
// inlined into the functions compiled per ISA, so GCC's ABI warning for the narrower ISAs is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace qkv::backend::cpu::simd {

using v2f = float __attribute__((vector_size(8)));
using v4f = float __attribute__((vector_size(16)));
using v8f = float __attribute__((vector_size(32)));
using v8i = std::int32_t __attribute__((vector_size(32)));
using v16f = float __attribute__((vector_size(64)));
using v16i = std::int32_t __attribute__((vector_size(64)));
using v4d = double __attribute__((vector_size(32)));
using v8d = double __attribute__((vector_size(64)));

/// The integer vector of a float vector's lanes, and their count.
template <class V> struct Lanes;
template <> struct Lanes<v8f> {
  using I = v8i;
  static constexpr int n = 8;
};
template <> struct Lanes<v16f> {
  using I = v16i;
  static constexpr int n = 16;
};

template <class V> [[gnu::always_inline]] inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V> [[gnu::always_inline]] inline void store(float* p, const V& v) { std::memcpy(p, &v, sizeof v); }
template <class V> [[gnu::always_inline]] inline V splat(float x) { return V{} + x; }

}  // namespace qkv::backend::cpu::simd
