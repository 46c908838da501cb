// Model folders: config.json through the reflected config structs, the weights checked against
// the module's named_parameters() before any is kept.
#include "models/pretrained.hpp"

#include <set>

#include "io/file.hpp"
#include "io/safetensors.hpp"
#include "ir/error.hpp"
#include "ir/passes/passes.hpp"
#include "models/bert.hpp"
#include "models/config.hpp"
#include "models/gpt2.hpp"
#include "models/llama.hpp"

namespace qkv::models {

namespace {

/// Every tensor of the folder's checkpoint: model.safetensors, or the shards its index lists.
io::TensorFile read_weights(const std::string& dir) {
  const std::string single = io::path_in(dir, "model.safetensors"), index = io::path_in(dir, "model.safetensors.index.json");
  if (io::is_file(single)) return io::read_safetensors(single);
  if (!io::is_file(index)) throw IoError(dir + ": no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are read)");
  const JsonDocument j = JsonDocument::read(index);
  const std::optional<JsonRef> map = j.root().find("weight_map");
  if (!map || !map->is_object()) throw IoError(index + ": no \"weight_map\" object");
  std::map<std::string, std::set<std::string>> by_shard;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string()) throw IoError(index + ": weight_map[\"" + name + "\"] is not a file name");
    by_shard[file.string()].insert(name);
  }
  io::TensorFile all;
  for (const auto& [file, names] : by_shard) {
    if (file.find('/') != std::string::npos || file == "..") throw IoError(index + ": shard \"" + file + "\" is not a file in the folder");
    io::TensorFile shard = io::read_safetensors(io::path_in(dir, file));
    for (const std::string& name : names) {
      auto it = shard.find(name);
      if (it == shard.end()) throw IoError(io::path_in(dir, file) + ": has no " + name + ", which the index places there");
      all.insert(shard.extract(it));
    }
  }
  return all;
}

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

/// The checkpoint's tensors matched to the module's parameters. A checkpoint saved from the base
/// model (GPT2Model, as the original gpt2 on the hub) lacks the "transformer." prefix; buffers
/// older transformers saved (attention masks) and a tied head's copy are not parameters.
std::map<std::string, Tensor, std::less<>> match_weights(const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& parameters,
                                                         io::TensorFile tensors, const std::string& where, const std::string& base_prefix,
                                                         const std::vector<std::string>& ignored_suffixes, WeightDtype held) {
  bool has_prefix = base_prefix.empty();
  for (const auto& [name, t] : tensors) has_prefix |= name.starts_with(base_prefix);
  std::map<std::string, Tensor, std::less<>> weights;
  std::vector<std::string> missing, wrong;
  for (const auto& [path, shape] : parameters) {
    std::string key = path;
    if (!has_prefix && key.starts_with(base_prefix)) key = key.substr(base_prefix.size());
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      missing.push_back(key);
      continue;
    }
    if (it->second.shape() != shape) {
      wrong.push_back(key + " is " + shape_text(it->second.shape()) + ", the config gives " + shape_text(shape));
    } else if (!is_float(it->second.dtype())) {
      wrong.push_back(key + " is " + std::string(dtype_name(it->second.dtype())) + ", not a float");
    } else {
      // f32, f16 and bf16 weights stay as the file holds them (views of it), unless asked in f32.
      const DType d = it->second.dtype();
      const bool keep = d == DType::f32 || (is_half(d) && held == WeightDtype::stored);
      weights.emplace(path, keep ? std::move(it->second) : it->second.to(DType::f32));
    }
    tensors.erase(it);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : tensors) {
    bool ignore = false;
    for (const std::string& s : ignored_suffixes) ignore |= name.ends_with(s);
    if (!ignore) unexpected.push_back(name);
  }
  if (missing.empty() && wrong.empty() && unexpected.empty()) return weights;
  std::string why;
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    why += std::string(why.empty() ? "" : "; ") + what + ": ";
    for (std::size_t i = 0; i < names.size() && i < 8; ++i) why += (i ? ", " : "") + names[i];
    if (names.size() > 8) why += " and " + std::to_string(names.size() - 8) + " more";
  };
  list("missing", missing);
  list("wrong", wrong);
  list("unexpected", unexpected);
  throw IoError(where + ": the checkpoint does not fit the config: " + why);
}

/// The model's graphs reading its f16 and bf16 weights as they are held.
void read_weights_as_held(Pretrained& p) {
  std::map<std::string, DType, std::less<>> stored;
  for (const auto& [name, t] : p.weights)
    if (is_half(t.dtype())) stored.emplace(name, t.dtype());
  if (stored.empty()) return;
  p.graph = ir::store_inputs_as(p.graph, stored);
  if (p.step_graph.size() > 0) p.step_graph = ir::store_inputs_as(p.step_graph, stored);
  if (p.paged_step_graph.size() > 0) p.paged_step_graph = ir::store_inputs_as(p.paged_step_graph, stored);
}

Pretrained load_architecture(const std::string& dir, const LoadOptions& options);

}  // namespace

bool is_model_dir(const std::string& path) { return io::is_directory(path) && io::is_file(io::path_in(path, "config.json")); }

Pretrained load_pretrained(const std::string& dir, const LoadOptions& options) {
  Pretrained p = load_architecture(dir, options);
  read_weights_as_held(p);
  return p;
}

namespace {

Pretrained load_architecture(const std::string& dir, const LoadOptions& options) {
  const WeightDtype held = options.weights;
  const std::string config_path = io::path_in(dir, "config.json");
  if (!io::is_directory(dir)) throw IoError(dir + ": not a folder");
  const JsonDocument document = JsonDocument::read(config_path);
  const JsonRef j = document.root();
  const std::optional<JsonRef> model_type = j.find("model_type");
  if (!model_type || !model_type->is_string()) throw IoError(config_path + ": no \"model_type\" string");
  Pretrained p;
  p.dir = dir;
  p.model_type = model_type->string();
  if (p.model_type == "gpt2") {
    const auto c = read_config<Gpt2Config>(j, config_path);
    const Gpt2LMHeadModel m = make_gpt2(c);
    p.parameters = named_parameters(m);
    p.weights = match_weights(p.parameters, read_weights(dir), dir, "transformer.", {".attn.bias", ".attn.masked_bias", "lm_head.weight"}, held);
    p.graph = gpt2_graph(m, c, options.outputs);
    p.step_graph = gpt2_step_graph(m, c);
    p.paged_step_graph = gpt2_paged_step_graph(m, c);
    p.layers = c.n_layer;
    p.kv_heads = c.n_head;
    p.head_dim = c.n_embd / c.n_head;
    p.vocab_size = c.vocab_size;
    p.max_positions = c.n_positions;
    p.eos_token_ids = c.eos_token_id.value_or(std::vector<std::int64_t>{});
    return p;
  }
  if (p.model_type == "llama") {
    const auto c = read_config<LlamaConfig>(j, config_path);
    const LlamaForCausalLM m = make_llama(c);
    p.parameters = named_parameters(m);
    // A tied checkpoint may hold the head's copy of the embedding (transformers ties it on load).
    std::vector<std::string> ignored{"rotary_emb.inv_freq"};
    if (!m.lm_head) ignored.push_back("lm_head.weight");
    p.weights = match_weights(p.parameters, read_weights(dir), dir, "", ignored, held);
    p.weights.emplace(kInvFreq, llama_inv_freq(c));
    p.graph = llama_graph(m, c, options.outputs);
    p.step_graph = llama_step_graph(m, c);
    p.paged_step_graph = llama_paged_step_graph(m, c);
    p.vocab_size = c.vocab_size;
    p.max_positions = c.max_position_embeddings;
    p.eos_token_ids = c.eos_token_id.value_or(std::vector<std::int64_t>{});
    p.layers = c.num_hidden_layers;
    p.kv_heads = c.num_key_value_heads.value_or(c.num_attention_heads);
    p.head_dim = c.head_dim.value_or(c.hidden_size / c.num_attention_heads);
    return p;
  }
  if (p.model_type == "bert") {
    const auto c = read_config<BertConfig>(j, config_path);
    io::TensorFile tensors = read_weights(dir);
    // A checkpoint of a model with a head (BertForMaskedLM, ...) holds the encoder under "bert.".
    if (!tensors.contains("embeddings.word_embeddings.weight") && tensors.contains("bert.embeddings.word_embeddings.weight")) {
      io::TensorFile encoder;
      for (auto& [name, t] : tensors)
        if (name.starts_with("bert.")) encoder.emplace(name.substr(5), std::move(t));
      tensors = std::move(encoder);
    }
    const BertModel m = make_bert(c, tensors.contains("pooler.dense.weight"));
    p.parameters = named_parameters(m);
    p.weights = match_weights(p.parameters, std::move(tensors), dir, "", {"position_ids"}, held);
    p.graph = bert_graph(m, c, options.outputs);
    p.vocab_size = c.vocab_size;
    p.max_positions = c.max_position_embeddings;
    p.layers = c.num_hidden_layers;
    p.data = {"input_ids", "token_type_ids", "position_ids", "attention_mask"};
    return p;
  }
  throw UsageError(config_path + ": model_type \"" + p.model_type + "\" is not built (gpt2, llama and bert are)");
}

}  // namespace

}  // namespace qkv::models
