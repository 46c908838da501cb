// The built-in models' graph builders (one file per family), gathered by registry.cpp.
#pragma once

#include "models/models.hpp"

namespace qkv::models {

/// A multi-head model's graph, written once with named dims (embedding E, heads H, key/value
/// heads Hkv), built for the options' "embed", "heads" and "kv_heads": the same graph (and so
/// the same kernels, views and fusions) as a model written for those sizes. Inexact divisions
/// are ShapeErrors (resolve_options says them first).
ir::Graph with_sizes(const ir::Graph& g, const Options& o);

ir::Graph build_sdpa(const Options& o, const Dims& dims);
ir::Graph build_mha(const Options& o, const Dims& dims);
ir::Graph build_self_attention(const Options& o, const Dims& dims);
ir::Graph build_causal_self_attention(const Options& o, const Dims& dims);
ir::Graph build_cross_attention(const Options& o, const Dims& dims);
ir::Graph build_gqa(const Options& o, const Dims& dims);
ir::Graph build_paged_attention(const Options& o, const Dims& dims);
ir::Graph build_decoder_block(const Options& o, const Dims& dims);
ir::Graph build_encoder_decoder_block(const Options& o, const Dims& dims);

}  // namespace qkv::models
