// qkv embed: sentence embeddings from an encoder's model folder (all-MiniLM-L6-v2 and its kind),
// as sentence-transformers computes them: a padded batch, mean pooling over the kept tokens,
// L2-normalised.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/file.hpp"
#include "io/npy.hpp"
#include "io/tokenizer.hpp"
#include "models/pretrained.hpp"
#include "tools/commands.hpp"

namespace qkv::tool {

namespace {

/// sentence-transformers' max_seq_length (sentence_bert_config.json), else the model's positions.
std::int64_t max_tokens(const std::string& dir, std::int64_t positions) {
  const std::string path = dir + "/sentence_bert_config.json";
  if (!std::filesystem::exists(path)) return positions;
  try {
    const nlohmann::json j = nlohmann::json::parse(io::read_file(path));
    if (j.contains("max_seq_length") && j["max_seq_length"].is_number_integer() && j["max_seq_length"].get<std::int64_t>() >= 2)
      return std::min(positions, j["max_seq_length"].get<std::int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw IoError(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  return positions;
}

}  // namespace

int cmd_embed(const EmbedFlags& f) {
  if (!models::is_model_dir(f.model)) throw UsageError(f.model + ": not a model folder (a folder with config.json, as transformers saves one)");
  std::vector<std::string> texts = f.texts;
  if (!f.file.empty()) {
    const std::string all = io::read_file(f.file);
    // A text a line, empty ones too (the rows of --out are the file's lines); no line after a final newline.
    for (std::size_t at = 0; at < all.size();) {
      const std::size_t end = std::min(all.find('\n', at), all.size());
      texts.push_back(all.substr(at, end - at));
      at = end + 1;
    }
  }
  if (texts.empty()) throw UsageError("no text: give --text TEXT (repeatable) or --file FILE (a text a line)");
  if (!f.out.empty()) io::check_writable(f.out);
  const models::Pretrained model = models::load_pretrained(f.model);
  bool encoder = false;
  for (const auto& [name, v] : model.graph.outputs()) encoder |= name == "sentence_embedding";
  if (!encoder) throw UsageError(f.model + ": a " + model.model_type + " model has no sentence embeddings (encoders such as bert do)");
  const io::Tokenizer tokenizer = io::Tokenizer::from_folder(f.model);
  const std::int64_t limit = max_tokens(f.model, model.max_positions);
  // The batch: each text's ids, truncated to the limit (its last token kept: [SEP]), padded.
  std::vector<std::vector<std::int32_t>> ids;
  std::int64_t longest = 1;
  for (const std::string& t : texts) {
    std::vector<std::int32_t> v = tokenizer.encode(t);
    if (static_cast<std::int64_t>(v.size()) > limit) {
      const std::int32_t last = v.back();
      v.resize(static_cast<std::size_t>(limit));
      v.back() = last;
    }
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(v.size()));
    ids.push_back(std::move(v));
  }
  const auto n = static_cast<std::int64_t>(texts.size());
  const std::int32_t pad = tokenizer.token_id("[PAD]").value_or(0);
  backend::TensorMap in(model.weights.begin(), model.weights.end());
  Tensor input_ids(DType::i32, {n, longest}), mask(DType::i32, {n, longest}), types(DType::i32, {n, longest}), positions(DType::i32, {n, longest});
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < longest; ++c) {
      const bool token = c < static_cast<std::int64_t>(ids[static_cast<std::size_t>(r)].size());
      input_ids.data<std::int32_t>()[r * longest + c] = token ? ids[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)] : pad;
      mask.data<std::int32_t>()[r * longest + c] = token;
      positions.data<std::int32_t>()[r * longest + c] = static_cast<std::int32_t>(c);
    }
  in["input_ids"] = input_ids;
  in["attention_mask"] = mask;
  in["token_type_ids"] = types;
  in["position_ids"] = positions;
  auto backend = backend::create(f.backend);
  const Tensor e = backend->compile(model.graph)->run(in).at("sentence_embedding");
  const std::int64_t dims = e.shape()[1];
  if (!f.out.empty()) io::write_npy(f.out, e);
  for (std::int64_t r = 0; r < n; ++r) {
    std::printf("[");
    for (std::int64_t i = 0; i < std::min<std::int64_t>(dims, 6); ++i) std::printf("%s%8.5f", i ? ", " : "", e.at(r * dims + i));
    std::printf(", ...] (%lld dims)  %s\n", static_cast<long long>(dims), texts[static_cast<std::size_t>(r)].c_str());
  }
  if (n > 1) {
    std::printf("cosine similarity:\n");
    for (std::int64_t a = 0; a < n; ++a) {
      for (std::int64_t b = 0; b < n; ++b) {
        double dot = 0;
        for (std::int64_t i = 0; i < dims; ++i) dot += e.at(a * dims + i) * e.at(b * dims + i);
        std::printf(" %6.3f", dot);
      }
      std::printf("\n");
    }
  }
  std::fflush(stdout);
  std::fprintf(stderr, "qkv: %lld texts, %lld tokens at most, on %s%s\n", static_cast<long long>(n), static_cast<long long>(longest),
               backend->name().c_str(), f.out.empty() ? "" : (", written to " + f.out).c_str());
  return 0;
}

}  // namespace qkv::tool
