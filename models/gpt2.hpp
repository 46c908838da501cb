// GPT-2 as Hugging Face transformers defines it (GPT2LMHeadModel): learned positions, pre-norm
// blocks of causal self-attention and a gelu_new MLP, Conv1D weights ([in, out]: y = x W + b),
// a final layer norm and an LM head tied to the token embedding. Any size a config.json gives.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "models/layers.hpp"

namespace qkv::models {

/// The keys of GPT2Config that change what the model computes.
struct Gpt2Config {
  BOOST_HANA_DEFINE_STRUCT(Gpt2Config,                                         //
                           (std::int64_t, vocab_size),                         //
                           (std::int64_t, n_positions),                        //
                           (std::int64_t, n_embd),                             //
                           (std::int64_t, n_layer),                            //
                           (std::int64_t, n_head),                             //
                           (std::optional<std::int64_t>, n_inner),             // null: 4 n_embd
                           (std::optional<double>, layer_norm_epsilon),        // 1e-5
                           (std::optional<std::string>, activation_function),  // gelu_new
                           (std::optional<bool>, scale_attn_weights),          // true
                           (std::optional<bool>, scale_attn_by_inverse_layer_idx), (std::optional<bool>, reorder_and_upcast_attn),
                           (std::optional<bool>, tie_word_embeddings),  // true
                           (std::optional<std::vector<std::int64_t>>, eos_token_id));
};

/// transformers' Conv1D: weight [in, out], bias [out].
struct Conv1D {
  BOOST_HANA_DEFINE_STRUCT(Conv1D, (Parameter, weight), (Parameter, bias));
};
struct Gpt2Attention {
  BOOST_HANA_DEFINE_STRUCT(Gpt2Attention, (Conv1D, c_attn), (Conv1D, c_proj));
};
struct Gpt2Mlp {
  BOOST_HANA_DEFINE_STRUCT(Gpt2Mlp, (Conv1D, c_fc), (Conv1D, c_proj));
};
struct Gpt2Block {
  BOOST_HANA_DEFINE_STRUCT(Gpt2Block, (LayerNorm, ln_1), (Gpt2Attention, attn), (LayerNorm, ln_2), (Gpt2Mlp, mlp));
};
struct Gpt2Model {
  BOOST_HANA_DEFINE_STRUCT(Gpt2Model, (Embedding, wte), (Embedding, wpe), (std::vector<Gpt2Block>, h), (LayerNorm, ln_f));
};
struct Gpt2LMHeadModel {
  BOOST_HANA_DEFINE_STRUCT(Gpt2LMHeadModel, (Gpt2Model, transformer), (std::optional<LmHead>, lm_head));
};

/// The module for a config, every parameter named and shaped; throws UsageError for configs that
/// ask for what is not built (another activation, attention without 1/sqrt(d) scaling).
Gpt2LMHeadModel make_gpt2(const Gpt2Config& c);

/// The forward graph: inputs input_ids and position_ids, i32 [B, T] (B and T named, bound when
/// run), and the parameters under their checkpoint names; outputs "logits" [B, T, V] and, with
/// outputs.hidden, "hidden" [B, T, E] (after the final layer norm); with outputs.attention_weights,
/// "weights.<layer>" [B, H, T, T].
ir::Graph gpt2_graph(const Gpt2LMHeadModel& m, const Gpt2Config& c, const GraphOutputs& outputs = {});

/// One generation step (a prefill of T tokens, or a decode step of one) against a key/value
/// cache: inputs input_ids and position_ids i32 [B, T], cache_start i32 [] (the cache slot the
/// step's first token takes, in every sequence) and cache_first i32 [B] (each sequence's first
/// slot: a prompt padded on the left starts later), and the cache "past.<layer>.key" / ".value"
/// [B, H, S, E/H] (S: the longest sequence), which the graph updates with the step's keys and
/// values written at [cache_start, cache_start + T) (cache_write, in place where the backend
/// holds the cache). Query t of sequence b sees slots [cache_first[b], cache_start + t]. Output
/// "logits" [B, 1, V]: the last position's, which the next token is picked from.
ir::Graph gpt2_step_graph(const Gpt2LMHeadModel& m, const Gpt2Config& c);

/// One generation step against a paged key/value cache: inputs input_ids and position_ids i32
/// [B, T] (each sequence's positions are its cache slots: no padding), cache_slots i32 [B, T]
/// (the pool row each new token's key and value go to, -1 for none: s = page * page_size + row)
/// and block_table i32 [B, NP] (each sequence's pages in order, -1 past its last), and the pool
/// "past.<layer>.key" / ".value" [pages, H, page_size, E/H], which the graph updates with the
/// step's keys and values (page_write, in place where the backend holds the pool). Query t of
/// sequence b sees its slots [0, position_ids[b, t]]. Output "logits" [B, 1, V].
ir::Graph gpt2_paged_step_graph(const Gpt2LMHeadModel& m, const Gpt2Config& c);

}  // namespace qkv::models
