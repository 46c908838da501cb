// Llama as Hugging Face transformers defines it (LlamaForCausalLM): RMSNorm, rotary embeddings
// (rope_theta, and Llama 3's rope scaling), grouped-query attention, a SwiGLU MLP, a head tied
// or not. Any size a config.json gives; rope settings as transformers 5 writes them
// ("rope_parameters") or as earlier checkpoints do ("rope_theta", "rope_scaling").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/tensor.hpp"
#include "models/layers.hpp"

namespace qkv::models {

/// rope_parameters / rope_scaling: "default" or "llama3" (with its factors).
struct RopeConfig {
  BOOST_HANA_DEFINE_STRUCT(RopeConfig,                                 //
                           (std::optional<std::string>, rope_type),    //
                           (std::optional<std::string>, type),         // older checkpoints' key
                           (std::optional<double>, rope_theta),        //
                           (std::optional<double>, factor),            //
                           (std::optional<double>, low_freq_factor),   //
                           (std::optional<double>, high_freq_factor),  //
                           (std::optional<std::int64_t>, original_max_position_embeddings));
};

struct LlamaConfig {
  BOOST_HANA_DEFINE_STRUCT(LlamaConfig,                                         //
                           (std::int64_t, vocab_size),                          //
                           (std::int64_t, hidden_size),                         //
                           (std::int64_t, intermediate_size),                   //
                           (std::int64_t, num_hidden_layers),                   //
                           (std::int64_t, num_attention_heads),                 //
                           (std::optional<std::int64_t>, num_key_value_heads),  // the heads
                           (std::optional<std::int64_t>, head_dim),             // hidden / heads
                           (std::int64_t, max_position_embeddings),             //
                           (std::optional<double>, rms_norm_eps),               // 1e-6
                           (std::optional<double>, rope_theta),                 // 10000
                           (std::optional<RopeConfig>, rope_scaling),           //
                           (std::optional<RopeConfig>, rope_parameters),        //
                           (std::optional<bool>, attention_bias),               // false
                           (std::optional<bool>, mlp_bias),                     // false
                           (std::optional<std::string>, hidden_act),            // silu
                           (std::optional<bool>, tie_word_embeddings),          // false
                           (std::optional<std::vector<std::int64_t>>, eos_token_id));
};

struct LlamaAttention {
  BOOST_HANA_DEFINE_STRUCT(LlamaAttention, (Linear, q_proj), (Linear, k_proj), (Linear, v_proj), (Linear, o_proj));
};
struct LlamaMlp {
  BOOST_HANA_DEFINE_STRUCT(LlamaMlp, (Linear, gate_proj), (Linear, up_proj), (Linear, down_proj));
};
struct LlamaDecoderLayer {
  BOOST_HANA_DEFINE_STRUCT(LlamaDecoderLayer, (RmsNorm, input_layernorm), (LlamaAttention, self_attn), (RmsNorm, post_attention_layernorm),
                           (LlamaMlp, mlp));
};
struct LlamaModel {
  BOOST_HANA_DEFINE_STRUCT(LlamaModel, (Embedding, embed_tokens), (std::vector<LlamaDecoderLayer>, layers), (RmsNorm, norm));
};
struct LlamaForCausalLM {
  BOOST_HANA_DEFINE_STRUCT(LlamaForCausalLM, (LlamaModel, model), (std::optional<LmHead>, lm_head));
};

/// The module for a config; UsageError for what is not built (another activation or rope type).
LlamaForCausalLM make_llama(const LlamaConfig& c);

/// The rotary frequencies [head_dim / 2] as transformers computes them in float32 (the buffer
/// model.rotary_emb.inv_freq): 1 / theta^(2i / d), rescaled by Llama 3's rope scaling.
Tensor llama_inv_freq(const LlamaConfig& c);
/// The graph input that holds llama_inv_freq (a buffer of the model, not in its checkpoint).
inline constexpr const char* kInvFreq = "model.rotary_emb.inv_freq";

/// The forward graph (as gpt2_graph: input_ids and position_ids [B, T] -> "logits", "hidden",
/// "weights.<layer>" [B, heads, T, T]).
ir::Graph llama_graph(const LlamaForCausalLM& m, const LlamaConfig& c, const GraphOutputs& outputs = {});
/// One generation step against the key/value cache (as gpt2_step_graph; the cache holds the
/// key/value heads: "past.<layer>.key" [B, kv_heads, S, head_dim]).
ir::Graph llama_step_graph(const LlamaForCausalLM& m, const LlamaConfig& c);
/// One generation step against a paged key/value cache (as gpt2_paged_step_graph; the pool holds
/// the key/value heads: "past.<layer>.key" [pages, kv_heads, page_size, head_dim]).
ir::Graph llama_paged_step_graph(const LlamaForCausalLM& m, const LlamaConfig& c);

}  // namespace qkv::models
