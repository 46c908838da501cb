// The CPU backend's fused attention: softmax(q kT * scale, masked) v without materialising the
// score matrix.
#pragma once

#include "backends/cpu/kernels.hpp"

namespace qkv::backend::cpu {

struct AttentionArgs {
  ConstView q, k, v;          // [..., N, D], [..., M, D], [..., M, Dv]; batch dims broadcast
  const ConstView* mask;      // nullptr, or a 0/1 keep-mask broadcasting to [..., N, M]
  float scale;
  bool causal;
  ir::CausalAlign align;
  std::int64_t window;        // with causal and > 0: only the last `window` keys (sliding window)
  View out;                   // [..., N, Dv]
};

/// Query blocks of kQueryBlock rows stream over key blocks of kKeyBlock keys with an online
/// softmax (running max and sum per row), so each thread holds kQueryBlock x (kKeyBlock + Dv)
/// floats whatever N and M are. Key blocks wholly above the causal diagonal, or wholly before a
/// sliding window, are skipped. A row
/// whose keys are all masked gives zeros, as the decomposition does.
void attention(const AttentionArgs& args);

inline constexpr std::int64_t kQueryBlock = 128;
inline constexpr std::int64_t kKeyBlock = 256;

}  // namespace qkv::backend::cpu
