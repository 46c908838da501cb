// The vector instruction set of the CPU this process runs on: chosen once, in one place, for
// every layer that has vector code (the cpu backend's kernels, ir/half.cpp's bulk conversions).
#pragma once

namespace qkv {

/// The instruction sets qkv's CPU code is compiled for: x86-64-v4 (AVX-512 F/BW/DQ/VL), x86-64-v3
/// (AVX2, FMA, F16C) and the baseline.
enum class Isa { baseline, avx2, avx512 };

/// The best instruction set this CPU runs, from cpuid, once per process. QKV_CPU_ISA=avx2 or
/// baseline caps it (to compare, or to test the other paths on a newer CPU): every vector path,
/// the half conversions' too, follows the cap.
Isa host_isa();

/// "AVX-512", "AVX2" or "baseline".
const char* isa_name(Isa isa);

}  // namespace qkv
