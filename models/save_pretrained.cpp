// A model folder written back: the weights as one f32 safetensors file, beside the settings
// (config, tokenizer, pooling) copied from the folder the model was loaded from.
#include <filesystem>

#include "io/file.hpp"
#include "io/safetensors.hpp"
#include "ir/error.hpp"
#include "models/pretrained.hpp"

namespace qkv::models {

namespace fs = std::filesystem;

void save_pretrained(const Pretrained& model, const std::map<std::string, Tensor, std::less<>>& weights, const std::string& out_dir) {
  io::make_dirs(out_dir);
  io::TensorFile checkpoint;
  for (const auto& [name, shape] : model.parameters) {
    auto it = weights.find(name);
    if (it == weights.end()) throw UsageError("save_pretrained: no value for " + name);
    if (it->second.shape() != shape)
      throw ShapeError("save_pretrained: " + name + " has shape of " + std::to_string(it->second.rank()) + " dims, not the config's");
    checkpoint.emplace(name, it->second.dtype() == DType::f32 ? it->second : it->second.to(DType::f32));
  }
  io::OutputBatch batch;
  batch.add((fs::path(out_dir) / "model.safetensors").string(), io::format_safetensors(checkpoint, {{"format", "pt"}}));
  // The folder's settings: config, tokenizer, generation and sentence-transformers' pooling (other
  // frameworks' weights, now stale, are not copied).
  static const char* const kSettings[] = {"config.json",
                                          "generation_config.json",
                                          "tokenizer.json",
                                          "tokenizer_config.json",
                                          "special_tokens_map.json",
                                          "added_tokens.json",
                                          "vocab.json",
                                          "vocab.txt",
                                          "merges.txt",
                                          "tokenizer.model",
                                          "sentence_bert_config.json",
                                          "config_sentence_transformers.json",
                                          "modules.json",
                                          "1_Pooling/config.json",
                                          "2_Normalize/config.json"};
  for (const char* rel : kSettings) {
    const fs::path from = fs::path(model.dir) / rel;
    if (!fs::is_regular_file(from)) continue;
    if (fs::path(rel).has_parent_path()) io::make_dirs((fs::path(out_dir) / fs::path(rel).parent_path()).string());
    batch.add((fs::path(out_dir) / rel).string(), io::read_file(from.string()));
  }
  batch.commit();
}

}  // namespace qkv::models
