// The vector instruction sets the CPU kernels are compiled for, and the dispatch between them.
//
// Each vectorised kernel is written once, as an always-inline template over its vector type
// (8 floats or 16), and compiled three times: for x86-64-v4 (AVX-512 F/BW/DQ/VL, 16 lanes), for
// x86-64-v3 (AVX2 + FMA, 8 lanes) and for the baseline ISA. The first call picks the best the
// CPU reports (cpuid), once per process, as OpenBLAS picks its own kernels.
#pragma once

#include "ir/host_isa.hpp"

namespace qkv::backend::cpu {

// The choice is made once for the whole process (ir/host_isa.hpp), with QKV_CPU_ISA's cap.
using ::qkv::host_isa;
using ::qkv::Isa;
using ::qkv::isa_name;

}  // namespace qkv::backend::cpu

#if defined(__x86_64__)
#define QKV_TARGET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define QKV_TARGET_AVX2 __attribute__((target("arch=x86-64-v3")))

/// Defines `ret name params`, which runs name##_impl<Wide> args on AVX-512 CPUs and
/// name##_impl<Narrow> args otherwise, compiled for AVX2 + FMA and for the baseline ISA.
#define QKV_ISA_DISPATCH(ret, name, params, args, Wide, Narrow)                        \
  QKV_TARGET_AVX512 static ret name##_avx512 params { return name##_impl<Wide> args; } \
  QKV_TARGET_AVX2 static ret name##_avx2 params { return name##_impl<Narrow> args; }   \
  static ret name##_baseline params { return name##_impl<Narrow> args; }               \
  ret name params {                                                                    \
    static const auto chosen = [] {                                                    \
      switch (::qkv::backend::cpu::host_isa()) {                                       \
        case ::qkv::backend::cpu::Isa::avx512: return &name##_avx512;                  \
        case ::qkv::backend::cpu::Isa::avx2: return &name##_avx2;                      \
        case ::qkv::backend::cpu::Isa::baseline: break;                                \
      }                                                                                \
      return &name##_baseline;                                                         \
    }();                                                                               \
    return chosen args;                                                                \
  }
#else
#define QKV_ISA_DISPATCH(ret, name, params, args, Wide, Narrow) \
  ret name params { return name##_impl<Narrow> args; }
#endif
