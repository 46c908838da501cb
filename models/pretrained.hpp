// Hugging Face model folders, as transformers' save_pretrained writes them: config.json (its
// model_type picks the architecture), the weights as model.safetensors or as shards listed by
// model.safetensors.index.json, and the tokenizer's files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.hpp"
#include "ir/tensor.hpp"
#include "models/module.hpp"

namespace qkv::models {

/// A model loaded from a folder: its forward graph and its weights under the graph's input names.
struct Pretrained {
  std::string dir;
  std::string model_type;  // config.json's: "gpt2"
  /// named_parameters() of the module the config describes, in declaration order.
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> parameters;
  /// Every parameter, by the name the graph's input has, in the checkpoint's dtype (f32, f16 or
  /// bf16; f32 when loaded with WeightDtype::f32) and mapped from its file, and the model's
  /// buffers the graph reads (Llama's model.rotary_emb.inv_freq).
  std::map<std::string, Tensor, std::less<>> weights;
  /// Decoders: input_ids and position_ids i32 [B, T] -> "logits" [B, T, vocab] (and "hidden" when
  /// asked); encoders (bert): see bert_graph.
  ir::Graph graph;
  /// A decoder's generation step against a key/value cache (gpt2_step_graph): input_ids,
  /// position_ids [B, T], cache_start [], cache_first [B] -> the last position's "logits"
  /// [B, 1, V]; held cache inputs "past.<layer>.key/value" [B, kv_heads, S, head_dim]. Empty
  /// for encoders.
  ir::Graph step_graph;
  /// The same step against a paged cache (gpt2_paged_step_graph): input_ids, position_ids,
  /// cache_slots [B, T], block_table [B, NP]; held pools "past.<layer>.key/value" [pages,
  /// kv_heads, page_size, head_dim]. Empty for encoders.
  ir::Graph paged_step_graph;
  std::int64_t layers = 0, kv_heads = 0, head_dim = 0;
  /// The graph's data inputs (the others are weights), each i32 [B, T].
  std::vector<std::string> data{"input_ids", "position_ids"};
  std::int64_t vocab_size = 0;
  std::int64_t max_positions = 0;
  std::vector<std::int64_t> eos_token_ids;
};

/// A decoder's next-token loss for fine-tuning: `model.graph` with an input "targets" i32 [B, T]
/// (the next token of each position, -1 where none is scored) and the output "loss": the mean
/// cross-entropy over the scored positions (transformers' loss with labels shifted, -100 as -1).
ir::Graph lm_loss_graph(const Pretrained& model);

/// Writes `weights` (the model's parameters under their checkpoint names, as trained) as a model
/// folder transformers' from_pretrained loads: model.safetensors with the checkpoint's names, and
/// config.json, the tokenizer's files and the others of `model.dir` copied. All files are written
/// or none (a failure leaves `out_dir` as it was).
void save_pretrained(const Pretrained& model, const std::map<std::string, Tensor, std::less<>>& weights, const std::string& out_dir);

/// Whether `path` is a model folder (a directory with a config.json).
bool is_model_dir(const std::string& path);

/// How a checkpoint's f16 and bf16 weights are held: as stored, the graphs declaring those inputs
/// f16 or bf16 and computing in f32 (ir::store_inputs_as), or widened to f32 once (to train them).
enum class WeightDtype { stored, f32 };

struct LoadOptions {
  /// What the forward graph outputs besides its result: "hidden", each layer's "weights.<layer>".
  GraphOutputs outputs;
  WeightDtype weights = WeightDtype::stored;
};

/// Reads config.json and the weights of the folder `dir` (model.safetensors, or the shards
/// model.safetensors.index.json lists; f32, f16 or bf16), memory-mapped: the weights are views
/// of the files (no copy). Every problem with the weights (a tensor missing, one the model does
/// not have, one of the wrong shape, an unreadable shard) is named in one IoError, and nothing
/// is returned half-loaded.
Pretrained load_pretrained(const std::string& dir, const LoadOptions& options = {});

}  // namespace qkv::models
