// The built-in models' graph builders (one file per family), gathered by registry.cpp.
#pragma once

#include "models/models.hpp"

namespace qkv::models {

/// The sizes the built-in multi-head models are compiled for: each size is a template
/// instantiation of the whole model, so the tool offers one (write a model of your own size in
/// the DSL, or run any graph from its IR text with `qkv run FILE.qkv`).
inline constexpr std::int64_t kModelEmbed = 32, kModelHeads = 4;
inline constexpr std::int64_t kGqaEmbed = 64, kGqaHeads = 8, kGqaKvHeads = 2;

ir::Graph build_sdpa(const Options& o, const Dims& dims);
ir::Graph build_mha(const Options& o, const Dims& dims);
ir::Graph build_self_attention(const Options& o, const Dims& dims);
ir::Graph build_causal_self_attention(const Options& o, const Dims& dims);
ir::Graph build_cross_attention(const Options& o, const Dims& dims);
ir::Graph build_gqa(const Options& o, const Dims& dims);
ir::Graph build_decoder_block(const Options& o, const Dims& dims);
ir::Graph build_encoder_decoder_block(const Options& o, const Dims& dims);

}  // namespace qkv::models
