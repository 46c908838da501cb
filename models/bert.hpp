// BERT encoders as Hugging Face transformers defines them (BertModel): word, position and
// token-type embeddings, post-norm layers of self-attention (padding keys masked by the attention
// mask) and a GELU MLP, the pooler; and sentence-transformers' mean pooling with normalisation
// (all-MiniLM-L6-v2 and its kind).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "models/layers.hpp"

namespace qkv::models {

struct BertConfig {
  BOOST_HANA_DEFINE_STRUCT(BertConfig,                                              //
                           (std::int64_t, vocab_size),                              //
                           (std::int64_t, hidden_size),                             //
                           (std::int64_t, num_hidden_layers),                       //
                           (std::int64_t, num_attention_heads),                     //
                           (std::int64_t, intermediate_size),                       //
                           (std::int64_t, max_position_embeddings),                 //
                           (std::optional<std::int64_t>, type_vocab_size),          // 2
                           (std::optional<double>, layer_norm_eps),                 // 1e-12
                           (std::optional<std::string>, hidden_act),                // gelu
                           (std::optional<std::string>, position_embedding_type));  // absolute
};

struct BertEmbeddings {
  BOOST_HANA_DEFINE_STRUCT(BertEmbeddings, (Embedding, word_embeddings), (Embedding, position_embeddings), (Embedding, token_type_embeddings),
                           (::qkv::models::LayerNorm, LayerNorm));
};
struct BertSelfAttention {
  BOOST_HANA_DEFINE_STRUCT(BertSelfAttention, (Linear, query), (Linear, key), (Linear, value));
};
/// A dense layer, then LayerNorm of it plus the residual.
struct BertDenseNorm {
  BOOST_HANA_DEFINE_STRUCT(BertDenseNorm, (Linear, dense), (::qkv::models::LayerNorm, LayerNorm));
};
struct BertAttention {
  BOOST_HANA_DEFINE_STRUCT(BertAttention, (BertSelfAttention, self), (BertDenseNorm, output));
};
struct BertIntermediate {
  BOOST_HANA_DEFINE_STRUCT(BertIntermediate, (Linear, dense));
};
struct BertLayer {
  BOOST_HANA_DEFINE_STRUCT(BertLayer, (BertAttention, attention), (BertIntermediate, intermediate), (BertDenseNorm, output));
};
struct BertEncoder {
  BOOST_HANA_DEFINE_STRUCT(BertEncoder, (std::vector<BertLayer>, layer));
};
struct BertPooler {
  BOOST_HANA_DEFINE_STRUCT(BertPooler, (Linear, dense));
};
struct BertModel {
  BOOST_HANA_DEFINE_STRUCT(BertModel, (BertEmbeddings, embeddings), (BertEncoder, encoder), (std::optional<BertPooler>, pooler));
};

/// The module for a config (with a pooler when `pooler`); UsageError for what is not built.
BertModel make_bert(const BertConfig& c, bool pooler);

/// The encoder's graph: inputs input_ids, token_type_ids, position_ids and attention_mask (1 for
/// a token, 0 for padding), i32 [B, T]; outputs "last_hidden_state" [B, T, E], "pooler_output"
/// [B, E] (with a pooler) and "sentence_embedding" [B, E]: the mean of the hidden states over the
/// tokens the mask keeps, L2-normalised (sentence-transformers' Pooling + Normalize); with
/// outputs.attention_weights, "weights.<layer>" [B, H, T, T] (outputs.hidden adds nothing:
/// last_hidden_state is always there).
ir::Graph bert_graph(const BertModel& m, const BertConfig& c, const GraphOutputs& outputs = {});

}  // namespace qkv::models
