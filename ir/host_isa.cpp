// The CPU's instruction set, read once (ir/host_isa.hpp).
#include "ir/host_isa.hpp"

#include <cstdlib>
#include <string_view>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace qkv {

Isa host_isa() {
  static const Isa isa = [] {
    Isa best = Isa::baseline;
#if defined(__x86_64__)
    __builtin_cpu_init();
#if defined(__clang__) && __clang_major__ < 18
    // Clang before 18 (the fuzzers' clang 14) knows no "x86-64-v3" here, nor "f16c" (CPUID leaf 1,
    // ECX bit 29): the levels' features one by one.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2") && f16c) best = Isa::avx2;
    if (best == Isa::avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
      best = Isa::avx512;
#else
    if (__builtin_cpu_supports("x86-64-v3")) best = Isa::avx2;
    if (__builtin_cpu_supports("x86-64-v4")) best = Isa::avx512;
#endif
#endif
    if (const char* cap = std::getenv("QKV_CPU_ISA")) {
      const std::string_view c = cap;
      if (c == "baseline") best = Isa::baseline;
      else if (c == "avx2" && best == Isa::avx512) best = Isa::avx2;
    }
    return best;
  }();
  return isa;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "AVX-512";
    case Isa::avx2: return "AVX2";
    case Isa::baseline: break;
  }
  return "baseline";
}

}  // namespace qkv
