// Whole transformer blocks, with parameters named as PyTorch's modules name them, so a
// state_dict exported from torch.nn.TransformerEncoderLayer / TransformerDecoderLayer
// (norm_first=True, batch_first=True) loads by name.
#pragma once

#include "dsl/multi_head.hpp"

namespace qkv::dsl {

/// The activation of feed_forward (and of the blocks' MLPs).
enum class Activation {
  relu,      ///< relu(x).
  gelu,      ///< The exact GELU, gelu(x).
  gelu_tanh  ///< The tanh approximation of GELU, gelu_tanh(x).
};

/// The activation A applied to x elementwise.
template <Activation A, Expr X> constexpr auto activate(X x) {
  if constexpr (A == Activation::relu) return relu(x);
  else if constexpr (A == Activation::gelu) return gelu(x);
  else return gelu_tanh(x);
}

/// torch's feed-forward of a transformer layer: linear2(activation(linear1(x))), parameters
/// "<Prefix>.linear1.weight" [F, E], ".linear1.bias" [F], ".linear2.weight" [E, F], ".linear2.bias".
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<32>);
///   auto y = feed_forward<"mlp", 32, 128, Activation::gelu>(x);
/// \endcode
template <FixedString Prefix, DimArg E, DimArg F, Activation A = Activation::relu, Expr X> constexpr auto feed_forward(X x) {
  auto h = linear(x, input<param_path<Prefix, "linear1.weight">()>(dim<F>, dim<E>), input<param_path<Prefix, "linear1.bias">()>(dim<F>));
  return linear(activate<A>(h), input<param_path<Prefix, "linear2.weight">()>(dim<E>, dim<F>), input<param_path<Prefix, "linear2.bias">()>(dim<E>));
}

/// layer_norm with parameters "<Prefix>.<Name>.weight" and ".bias" [E] (torch.nn.LayerNorm).
template <FixedString Prefix, FixedString Name, DimArg E, Expr X> constexpr auto named_layer_norm(X x, double eps = 1e-5) {
  constexpr auto path = param_path<Prefix, Name>();
  return layer_norm(x, input<param_path<path, "weight">()>(dim<E>), input<param_path<path, "bias">()>(dim<E>), eps);
}

/// A pre-norm transformer decoder block (GPT-style: causal self-attention and an MLP, each after
/// a layer norm and around a residual): x + attn(norm1(x)), then + ff(norm2(.)). The parameters
/// are those of torch.nn.TransformerEncoderLayer(E, H, F, norm_first=True, batch_first=True)
/// run with a causal mask: "<Prefix>.self_attn.*", "linear1", "linear2", "norm1", "norm2".
/// `opts` go to the self-attention (padding masks, ALiBi biases, sliding_window<W>, ...).
/// \code
///   auto x = input<"x">(dim<"B">, dim<"T">, dim<32>);
///   auto y = decoder_block<"layers.0", 32, 4, 64>(x);  // [B, T, 32]
/// \endcode
template <FixedString Prefix, DimArg E, DimArg H, DimArg F, Activation A = Activation::relu, Expr X, class... Opts>
constexpr auto decoder_block(X x, Opts... opts) {
  constexpr auto attn = param_path<Prefix, "self_attn">();
  auto h = x + multi_head_attention<H>(named_layer_norm<Prefix, "norm1", E>(x), named_layer_norm<Prefix, "norm1", E>(x),
                                       named_layer_norm<Prefix, "norm1", E>(x), mha_params<attn, E>(), causal, opts...)
                   .output;
  return h + feed_forward<Prefix, E, F, A>(named_layer_norm<Prefix, "norm2", E>(h));
}

/// A pre-norm encoder-decoder (decoder) block: causal self-attention, cross-attention to the
/// encoder's output `memory` [B, M, E], and an MLP, each pre-normed and residual, as
/// torch.nn.TransformerDecoderLayer(E, H, F, norm_first=True, batch_first=True) with a causal
/// tgt_mask: parameters "<Prefix>.self_attn.*", "multihead_attn.*", "linear1", "linear2",
/// "norm1", "norm2", "norm3".
/// \code
///   auto tgt = input<"tgt">(dim<"B">, dim<"T">, dim<32>);
///   auto memory = input<"memory">(dim<"B">, dim<"S">, dim<32>);
///   auto y = encoder_decoder_block<"", 32, 4, 64>(tgt, memory);
/// \endcode
template <FixedString Prefix, DimArg E, DimArg H, DimArg F, Activation A = Activation::relu, Expr X, Expr M>
constexpr auto encoder_decoder_block(X x, M memory) {
  constexpr auto self_path = param_path<Prefix, "self_attn">();
  constexpr auto cross_path = param_path<Prefix, "multihead_attn">();
  auto n1 = named_layer_norm<Prefix, "norm1", E>(x);
  auto h = x + multi_head_attention<H>(n1, n1, n1, mha_params<self_path, E>(), causal).output;
  auto n2 = named_layer_norm<Prefix, "norm2", E>(h);
  auto h2 = h + multi_head_attention<H>(n2, memory, memory, mha_params<cross_path, E>()).output;
  return h2 + feed_forward<Prefix, E, F, A>(named_layer_norm<Prefix, "norm3", E>(h2));
}

}  // namespace qkv::dsl
