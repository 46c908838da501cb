// Building blocks of transformer models, written with the DSL's ops: linear layers in PyTorch's
// weight layout, normalisations and activations.
#pragma once

#include <cmath>

#include "dsl/ops.hpp"

namespace qkv::dsl {

/// x @ W^T + b with W [out, in] and b [out]: torch.nn.Linear's layout.
/// \code
///   auto x = input<"x">(dim<"B">, dim<"N">, dim<64>);
///   auto y = linear(x, input<"w">(dim<128>, dim<64>), input<"b">(dim<128>));  // [B, N, 128]
/// \endcode
template <Expr X, Expr W, Expr B> constexpr auto linear(X x, W w, B b) { return matmul<false, true>(x, w) + b; }
/// x @ W^T, without a bias.
template <Expr X, Expr W> constexpr auto linear(X x, W w) { return matmul<false, true>(x, w); }

/// The type of no_bias.
struct NoBias {};
/// The bias of a layer built with bias=False: linear and add_bias add nothing for it.
inline constexpr NoBias no_bias{};
/// x @ W^T: linear without a bias, for a layer built with bias=False.
template <Expr X, Expr W> constexpr auto linear(X x, W w, NoBias) { return matmul<false, true>(x, w); }
/// x + b, broadcasting.
template <Expr X, Expr B> constexpr auto add_bias(X x, B b) { return x + b; }
/// x unchanged: add_bias for a layer built with bias=False.
template <Expr X> constexpr auto add_bias(X x, NoBias) { return x; }

/// Layer normalisation over the last dim, as torch.nn.functional.layer_norm: (x - mean) /
/// sqrt(var + eps) * gamma + beta, with the biased variance.
template <Expr X, Expr G, Expr B> constexpr auto layer_norm(X x, G gamma, B beta, double eps = 1e-5) {
  auto centred = x - mean<-1>(x);
  return centred / sqrt(mean<-1>(centred * centred) + eps) * gamma + beta;
}

/// RMS normalisation over the last dim: x / sqrt(mean(x^2) + eps) * gamma.
template <Expr X, Expr G> constexpr auto rms_norm(X x, G gamma, double eps = 1e-6) { return x / sqrt(mean<-1>(x * x) + eps) * gamma; }

/// max(x, 0) elementwise.
template <Expr X> constexpr auto relu(X x) { return maximum(x, 0.0); }
/// The logistic function 1 / (1 + e^-x) elementwise.
template <Expr X> constexpr auto sigmoid(X x) { return 1.0 / (exp(-x) + 1.0); }
/// x * sigmoid(x) (also called swish).
template <Expr X> constexpr auto silu(X x) { return x * sigmoid(x); }
/// The exact GELU: x/2 * (1 + erf(x / sqrt 2)), torch's approximate='none'.
template <Expr X> constexpr auto gelu(X x) { return x * 0.5 * (erf(x * 0.70710678118654752) + 1.0); }
/// The tanh GELU: x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch's approximate='tanh'.
template <Expr X> constexpr auto gelu_tanh(X x) { return x * 0.5 * (tanh((x + x * x * x * 0.044715) * 0.79788456080286536) + 1.0); }
/// Logit soft-capping: cap * tanh(x / cap), keeping scores within (-cap, cap).
template <Expr X> constexpr auto softcap(X x, double cap) { return tanh(x / cap) * cap; }

}  // namespace qkv::dsl
