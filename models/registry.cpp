// The built-in models, their options and default sizes, and random parameters for them.
#include <algorithm>
#include <cmath>

#include "ir/passes/passes.hpp"
#include "models/builders.hpp"

namespace qkv::models {

namespace {

[[noreturn]] void bad_value(const std::string& name, const std::string& value, const char* want) {
  throw UsageError("option " + name + "=" + value + ": expected " + want);
}

/// Sizes: any; the graph is built for them (see with_sizes).
const std::vector<OptionSpec> kMultiHead = {{"embed", "32", "embedding size E (any size the heads divide)"}, {"heads", "4", "number of heads H"}};
const std::vector<OptionSpec> kGqa = {{"embed", "64", "embedding size E (any size the heads divide)"},
                                      {"heads", "8", "query heads H"},
                                      {"kv_heads", "2", "key/value heads (must divide the query heads)"}};

std::vector<OptionSpec> with(std::vector<OptionSpec> base, std::vector<OptionSpec> more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

}  // namespace

const std::string& Options::text(const std::string& name) const {
  auto it = values_.find(name);
  QKV_ASSERT(it != values_.end(), "model option " + name + " read but not declared");
  return it->second;
}
bool Options::flag(const std::string& name) const {
  const std::string& v = text(name);
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  bad_value(name, v, "true or false");
}
double Options::number(const std::string& name) const {
  const std::string& v = text(name);
  try {
    std::size_t used = 0;
    double d = std::stod(v, &used);
    if (used == v.size() && std::isfinite(d)) return d;
  } catch (const std::exception&) {}
  bad_value(name, v, "a number");
}
std::int64_t Options::integer(const std::string& name) const {
  const std::string& v = text(name);
  try {
    std::size_t used = 0;
    long long i = std::stoll(v, &used);
    if (used == v.size() && i > 0) return i;
  } catch (const std::exception&) {}
  bad_value(name, v, "a positive integer");
}

const std::vector<ModelSpec>& all_models() {
  static const std::vector<ModelSpec> models = {
      {"sdpa",
       "scaled dot-product attention: softmax(q kT * scale [masked]) v",
       {{"causal", "false", "mask future keys"},
        {"mask", "false", "a bool input mask [B, N, M] (true keeps a key)"},
        {"scale", "auto", "score scale (auto: 1/sqrt(D))"},
        {"softcap", "none", "soft-cap the scores: c * tanh(s / c) (a score modifier, fused as flex attention)"},
        {"dropout", "0", "dropout on the weights with probability p in [0, 1), keyed by an i32 input seed (fused with weights=false)"},
        {"weights", "true", "also output the weights [B, N, M] (false lets backends fuse: no score matrix)"}},
       {"q", "k", "v", "mask", "seed"},
       {{"B", 2}, {"N", 8}, {"M", 8}, {"D", 16}, {"Dv", 16}},
       build_sdpa},
      {"mha",
       "torch.nn.MultiheadAttention(E, H, batch_first=True): query, key, value and torch's parameter names",
       with(kMultiHead, {{"causal", "false", "mask future keys (bottom-right aligned)"}}),
       {"query", "key", "value"},
       {{"B", 2}, {"N", 8}, {"M", 8}},
       build_mha},
      {"self-attention",
       "multi-head self-attention over x [B, N, E] (nn.MultiheadAttention(x, x, x))",
       kMultiHead,
       {"x"},
       {{"B", 2}, {"N", 8}},
       build_self_attention},
      {"cross-attention",
       "multi-head cross-attention: queries from x [B, N, E], keys and values from memory [B, M, E]",
       kMultiHead,
       {"x", "memory"},
       {{"B", 2}, {"N", 5}, {"M", 8}},
       build_cross_attention},
      {"causal-self-attention",
       "multi-head self-attention where position t sees positions <= t",
       kMultiHead,
       {"x"},
       {{"B", 2}, {"N", 8}},
       build_causal_self_attention},
      {"gqa",
       "Llama-style causal grouped-query attention (q_proj, k_proj, v_proj, o_proj; no biases)",
       with(kGqa, {{"rope", "false", "rotary embeddings on queries and keys (half-split)"}}),
       {"x"},
       {{"B", 2}, {"N", 8}},
       build_gqa},
      {"paged-attention",
       "new tokens' attention against a paged key/value cache (vLLM's PagedAttention): grouped query heads, keys and values "
       "read through a block table, query t of sequence b seeing the slots up to positions[b, t]",
       {{"heads", "8", "query heads H"},
        {"kv_heads", "2", "key/value heads (must divide the query heads)"},
        {"pages", "32", "the pool's pages (fixed: the pages' gradient sums each page's readers into it)"}},
       {"q", "k_pages", "v_pages", "block_table", "positions"},
       {{"B", 2}, {"T", 1}, {"D", 64}, {"page", 16}, {"NP", 8}},
       build_paged_attention},
      {"decoder-block",
       "pre-norm causal transformer block (torch TransformerEncoderLayer(norm_first=True), causal); FFN 4E",
       with(kMultiHead, {{"activation", "relu", "relu or gelu"}}),
       {"x"},
       {{"B", 2}, {"N", 8}},
       build_decoder_block},
      {"encoder-decoder-block",
       "pre-norm decoder layer with cross-attention to memory (torch TransformerDecoderLayer(norm_first=True))",
       with(kMultiHead, {{"activation", "relu", "relu or gelu"}}),
       {"x", "memory"},
       {{"B", 2}, {"N", 5}, {"M", 8}},
       build_encoder_decoder_block},
  };
  return models;
}

ir::Graph with_sizes(const ir::Graph& g, const Options& o) {
  std::map<std::string, std::int64_t> sizes{{"E", o.integer("embed")}, {"H", o.integer("heads")}};
  if (o.values().contains("kv_heads")) sizes.emplace("Hkv", o.integer("kv_heads"));
  return ir::specialize_dims(g, sizes);
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& m : all_models()) names.push_back(m.name);
  return names;
}

const ModelSpec& find_model(const std::string& name) {
  for (const auto& m : all_models())
    if (m.name == name) return m;
  std::string list;
  for (const auto& n : model_names()) list += (list.empty() ? "" : ", ") + n;
  throw UsageError("no model '" + name + "' (models: " + list + ")");
}

Options resolve_options(const ModelSpec& model, const std::map<std::string, std::string>& set) {
  std::map<std::string, std::string> values;
  for (const auto& o : model.options) values[o.name] = o.default_value;
  for (const auto& [name, value] : set) {
    if (!values.contains(name)) {
      std::string list;
      for (const auto& o : model.options) list += (list.empty() ? "" : ", ") + o.name;
      throw UsageError(model.name + " has no option '" + name + "' (options: " + (list.empty() ? "none" : list) + ")");
    }
    values[name] = value;
  }
  Options o(std::move(values));
  // Sizes that cannot work, said before any graph is built.
  for (const auto& spec : model.options)
    if (spec.name == "embed" || spec.name == "heads" || spec.name == "kv_heads") o.integer(spec.name);
  auto has = [&](const char* name) { return o.values().contains(name); };
  if (has("embed") && has("heads") && o.integer("embed") % o.integer("heads") != 0)
    throw UsageError(model.name + ": embed=" + o.text("embed") + " is not divisible by heads=" + o.text("heads"));
  if (has("heads") && has("kv_heads") && o.integer("heads") % o.integer("kv_heads") != 0)
    throw UsageError(model.name + ": heads=" + o.text("heads") + " is not divisible by kv_heads=" + o.text("kv_heads"));
  return o;
}

}  // namespace qkv::models
