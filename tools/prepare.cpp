// Graphs and inputs for the qkv commands.
#include "tools/prepare.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "backends/equivalence.hpp"
#include "io/file.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "io/tokenizer.hpp"
#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "models/models.hpp"
#include "models/pretrained.hpp"
#include "train/init.hpp"

namespace qkv::tool {

std::map<std::string, std::string> pairs(const std::vector<std::string>& items, const char* what) {
  std::map<std::string, std::string> r;
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError(std::string(what) + " expects NAME=VALUE, got '" + item + "'");
    if (eq + 1 == item.size()) throw UsageError(std::string(what) + " " + item + ": no value after '='");
    if (!r.emplace(item.substr(0, eq), item.substr(eq + 1)).second)
      throw UsageError(std::string(what) + " " + item.substr(0, eq) + " is given twice");
  }
  return r;
}

std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

std::int64_t parse_size(const std::string& flag, const std::string& name, const std::string& value) {
  std::int64_t v = -1;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || v < 0)
    throw UsageError(flag + " " + name + "=" + value + ": expected a size (a whole number >= 0)");
  return v;
}

namespace {

bool is_graph_file(const std::string& target) { return target.size() > 4 && target.ends_with(".qkv"); }

const ir::Node* find_input(const ir::Graph& g, const std::string& name) {
  for (ir::ValueId v : g.inputs())
    if (g.node(v).name == name) return &g.node(v);
  return nullptr;
}

std::string input_list(const ir::Graph& g) {
  std::string s;
  for (ir::ValueId v : g.inputs()) s += (s.empty() ? "" : ", ") + g.node(v).name + " " + g.type_string(v);
  return s;
}

/// The tensor from `file` for graph input `n`: converted to its dtype where that loses nothing,
/// with leading dims of size 1 added up to its rank (a file of at least two dims: a matrix for a
/// batch of them). `stored` is the file's own dtype, for messages. Returns how many were added.
int fit(const ir::Graph& g, const ir::Node& n, Tensor& t, const std::string& file, const std::string& stored) {
  if (t.dtype() != n.dtype) {
    if ((is_float(t.dtype()) || is_half(t.dtype())) && is_float(n.dtype)) t = t.to(n.dtype);  // f16, bf16: exactly
    else
      throw UsageError(file + ": input '" + n.name + "' must be " + std::string(dtype_name(n.dtype)) + ", got " +
                       (stored.empty() ? std::string(dtype_name(t.dtype())) : stored));
  }
  int added = 0;
  if (t.rank() < n.shape.rank && t.rank() >= std::min(2, n.shape.rank)) {
    std::vector<std::int64_t> s(static_cast<std::size_t>(n.shape.rank - t.rank()), 1);
    added = static_cast<int>(s.size());
    s.insert(s.end(), t.shape().begin(), t.shape().end());
    t = t.reshaped(s);
  }
  if (t.rank() != n.shape.rank)
    throw UsageError(file + ": input '" + n.name + "' must be " + g.type_string(n.dtype, n.shape) + ", got shape " + shape_string(t.shape()));
  return added;
}

/// Named dims bound by `t` as input `n`.
void bind_dims(const ir::Graph& g, const ir::Node& n, const Tensor& t, std::map<std::string, std::int64_t>& dims) {
  for (int i = 0; i < n.shape.rank; ++i)
    if (ir::is_symbol(n.shape[i]) && !g.derived_dims().contains(n.shape[i])) dims[g.dim_name(n.shape[i])] = t.shape()[static_cast<std::size_t>(i)];
}

struct WeightFile {
  Tensor tensor;
  std::string file;  // the .npy file, or the safetensors file
};

std::map<std::string, WeightFile> load_weights(const std::string& path) {
  std::map<std::string, WeightFile> w;
  if (std::filesystem::is_directory(path)) {
    for (const auto& e : std::filesystem::directory_iterator(path))
      if (e.path().extension() == ".npy") w.emplace(e.path().stem().string(), WeightFile{io::read_npy(e.path().string()), e.path().string()});
    if (w.empty()) throw UsageError(path + ": no .npy files in the folder");
    return w;
  }
  if (!std::filesystem::exists(path)) throw UsageError(path + ": no such file or folder");
  for (auto& [name, t] : io::read_safetensors(path)) w.emplace(name, WeightFile{std::move(t), path});
  return w;
}

/// `dims` and a size of 8 for each other named dim of `g`.
std::map<std::string, std::int64_t> with_default_sizes(const ir::Graph& g, std::map<std::string, std::int64_t> dims) {
  for (const auto& [id, name] : g.symbols())
    if (!g.derived_dims().contains(id)) dims.try_emplace(name, 8);
  return dims;
}

/// Parameters of `g` (the f32 inputs not in `data`) from the seed, as PyTorch's modules start:
/// Xavier-uniform weights, zero biases, norm weights of one.
backend::TensorMap random_parameters(const ir::Graph& g, const std::vector<std::string>& data, std::uint64_t seed,
                                     const std::map<std::string, std::int64_t>& dims) {
  std::vector<std::string> weights, biases, norms;
  for (ir::ValueId v : g.inputs()) {
    const ir::Node& n = g.node(v);
    if (n.dtype != DType::f32 || std::find(data.begin(), data.end(), n.name) != data.end()) continue;
    if (n.name.find("bias") != std::string::npos) biases.push_back(n.name);
    else if (n.name.find("norm") != std::string::npos) norms.push_back(n.name);
    else weights.push_back(n.name);
  }
  backend::TensorMap out = train::initialize(g, weights, {train::Init::xavier_uniform}, seed, dims);
  out.merge(train::initialize(g, biases, {train::Init::zeros}, seed, dims));
  out.merge(train::initialize(g, norms, {train::Init::ones}, seed, dims));
  return out;
}

}  // namespace

void fill_missing(const ir::Graph& graph, backend::TensorMap& given, const std::map<std::string, std::int64_t>& dims, std::uint64_t seed) {
  backend::TensorMap random = backend::random_inputs(graph, with_default_sizes(graph, dims), seed);
  for (auto& [name, t] : random) {
    if (given.contains(name)) continue;
    if (t.dtype() == DType::boolean && t.rank() >= 1) {  // keep the first key of every mask row, so no row is empty
      const std::int64_t last = t.shape().back();
      for (std::int64_t i = 0; i < t.numel(); i += last) t.data<std::uint8_t>()[i] = 1;
    }
    given.emplace(name, std::move(t));
  }
}

namespace {

/// NumPy broadcasting of two leading shapes; nullopt when they do not broadcast.
std::optional<std::vector<std::int64_t>> broadcast_shapes(std::vector<std::int64_t> a, std::vector<std::int64_t> b) {
  if (a.size() < b.size()) std::swap(a, b);
  b.insert(b.begin(), a.size() - b.size(), 1);
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i] || b[i] == 1) continue;
    if (a[i] != 1) return std::nullopt;
    a[i] = b[i];
  }
  return a;
}

/// `t` [lead..., rest...] broadcast to [batch..., rest...] and folded to [prod(batch), rest...].
Tensor fold_batch(const Tensor& t, std::size_t lead, const std::vector<std::int64_t>& batch) {
  std::vector<std::int64_t> rest(t.shape().begin() + static_cast<std::ptrdiff_t>(lead), t.shape().end());
  std::int64_t inner = 1, outer = 1;
  for (auto d : rest) inner *= d;
  for (auto d : batch) outer *= d;
  std::vector<std::int64_t> shape{outer};
  shape.insert(shape.end(), rest.begin(), rest.end());
  Tensor out(t.dtype(), shape);
  std::vector<std::int64_t> lead_shape(t.shape().begin(), t.shape().begin() + static_cast<std::ptrdiff_t>(lead));
  lead_shape.insert(lead_shape.begin(), batch.size() - lead_shape.size(), 1);
  const std::size_t esize = dtype_size(t.dtype());
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t rem = o, src = 0, stride = 1;
    for (std::size_t i = batch.size(); i-- > 0;) {
      const std::int64_t idx = rem % batch[i];
      rem /= batch[i];
      if (lead_shape[i] != 1) src += idx * stride;
      stride *= lead_shape[i];
    }
    std::memcpy(out.raw() + static_cast<std::size_t>(o * inner) * esize, t.raw() + static_cast<std::size_t>(src * inner) * esize,
                static_cast<std::size_t>(inner) * esize);
  }
  return out;
}

std::string symbol_list(const ir::Graph& g) {
  std::string s;
  for (const auto& [id, name] : g.symbols())
    if (!g.derived_dims().contains(id)) s += (s.empty() ? "" : ", ") + name;
  return s.empty() ? "none" : s;
}

/// An --in file's tensor, and its dtype as NumPy names it (empty for a .safetensors tensor).
struct InFile {
  Tensor tensor;
  std::string stored;
};

/// Each --in file, read once: NAME=FILE.npy, or NAME=FILE.safetensors[:TENSOR] (the tensor named
/// TENSOR, or the input's own name; a file several inputs take from is mapped once).
std::map<std::string, InFile> read_input_files(const Request& r) {
  std::map<std::string, InFile> files;
  std::map<std::string, io::TensorFile> safetensors;
  for (const auto& [name, file] : r.in) {
    InFile f;
    const std::size_t colon = file.rfind(".safetensors:");
    if (colon != std::string::npos || file.ends_with(".safetensors")) {
      const std::string path = colon == std::string::npos ? file : file.substr(0, colon + 12);
      const std::string tensor = colon == std::string::npos ? name : file.substr(colon + 13);
      auto cached = safetensors.find(path);
      if (cached == safetensors.end()) cached = safetensors.emplace(path, io::read_safetensors(path)).first;
      const io::TensorFile& all = cached->second;
      const auto found = all.find(tensor);
      if (found == all.end()) {
        std::string list;
        for (const auto& [t, v] : all) list += (list.empty() ? "" : ", ") + t;
        throw UsageError("--in " + name + "=" + file + ": " + path + " has no tensor '" + tensor + "' (tensors: " + (list.empty() ? "none" : list) +
                         ")");
      }
      f.tensor = found->second;
    } else {
      f.tensor = io::read_npy(file, &f.stored);
    }
    files.emplace(name, std::move(f));
  }
  return files;
}

}  // namespace

Prepared prepare(const Request& r) {
  Prepared p;
  std::map<std::string, std::int64_t> dims;
  for (const auto& [name, value] : r.dims) dims[name] = parse_size("--dim", name, value);
  const std::map<std::string, InFile> files = read_input_files(r);
  const models::ModelSpec* spec = nullptr;
  std::optional<models::Pretrained> pretrained;
  if (!r.prompt.empty() && !models::is_model_dir(r.target)) throw UsageError("--prompt is for model folders; " + r.target + " is not one");
  if (models::is_model_dir(r.target)) {
    if (!r.set.empty()) throw UsageError("--set is for built-in models; " + r.target + " is a model folder (its config.json sets it)");
    if (!r.weights.empty()) throw UsageError("--weights " + r.weights + ": " + r.target + " is a model folder with weights of its own");
    models::LoadOptions options;
    options.outputs.attention_weights = r.attention_weights;
    pretrained = models::load_pretrained(r.target, options);
    p.graph = pretrained->graph;
    p.data = pretrained->data;
    std::int64_t count = 0;
    for (const auto& [name, shape] : pretrained->parameters) {
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      count += n;
    }
    p.title = r.target + " (" + pretrained->model_type + ", " + std::to_string(count) + " parameters)";
  } else if (is_graph_file(r.target)) {
    if (!r.set.empty()) throw UsageError("--set is for built-in models; " + r.target + " is a graph already");
    std::string text = io::read_file(r.target);
    try {
      p.graph = ir::parse_graph(text);
    } catch (const IrError& e) {
      // One line: the verifier's message goes on with the whole graph, which the file already is.
      const std::string what = e.what();
      throw UsageError(r.target + ": " + what.substr(0, what.find('\n')));
    }
    if (p.graph.outputs().empty()) throw UsageError(r.target + ": the graph returns nothing (end it with 'return NAME=%N')");
    for (ir::ValueId v : p.graph.inputs()) p.data.push_back(p.graph.node(v).name);
    p.title = r.target;
  } else {
    models::Options options;
    spec = &models::find_model(r.target);
    options = models::resolve_options(*spec, r.set);
    for (const auto& [name, size] : r.fallback_dims) dims.try_emplace(name, size);  // before the model's own defaults
    for (const auto& [name, size] : spec->dims) dims.try_emplace(name, size);
    p.data = spec->data;
    p.title = spec->name;
    std::string opts;
    for (const auto& [name, value] : options.values()) opts += (opts.empty() ? "" : ", ") + name + "=" + value;
    if (!opts.empty()) p.title += " (" + opts + ")";
    p.graph = spec->build(options, dims);
  }
  if (r.dtype != "f32") {
    const std::optional<DType> dtype = parse_dtype(r.dtype);
    if (!dtype || !is_half(*dtype)) throw UsageError("--dtype " + r.dtype + ": f32, f16 or bf16");
    if (!spec && !pretrained) throw UsageError("--dtype is for built-in models and model folders; " + r.target + " declares its own dtypes");
    p.graph = ir::to_dtype(p.graph, *dtype);  // files and weights in other float dtypes are converted to it
    p.title += " in " + r.dtype;
  }
  // --dim names the graph's own named dims.
  std::set<std::string> symbols;
  for (const auto& [id, name] : p.graph.symbols())
    if (!p.graph.derived_dims().contains(id)) symbols.insert(name);
  for (const auto& [name, value] : r.dims)
    if (!symbols.contains(name))
      throw UsageError("--dim " + name + "=" + value + ": " + p.title + " has no dim '" + name + "' (named dims: " + symbol_list(p.graph) + ")");
  for (const auto& [name, size] : r.fallback_dims)
    if (symbols.contains(name)) dims.try_emplace(name, size);
  // The backward graph (or forward mode's), and the exact names of its gradient seeds (inputs
  // d<output>; forward mode: the tangents t_<input>).
  std::optional<ir::Graph> backward;
  std::set<std::string> seeds;
  if (r.grad && r.jvp) throw UsageError("--grad and --jvp: give one (reverse mode or forward mode)");
  if (r.grad || r.jvp) {
    std::vector<std::string> wrt, outs;
    for (ir::ValueId v : p.graph.inputs())
      if (is_float(p.graph.node(v).dtype)) wrt.push_back(p.graph.node(v).name);
    for (const auto& [name, v] : p.graph.outputs())
      if (is_float(p.graph.node(v).dtype)) outs.push_back(name);
    if (wrt.empty()) throw UsageError(std::string(r.grad ? "--grad" : "--jvp") + ": " + p.title + " has no float input to differentiate");
    backward = r.grad ? ir::build_backward(p.graph, {"", wrt, outs}) : ir::build_jvp(p.graph, {wrt, outs});
    for (ir::ValueId v : backward->inputs())
      if (!find_input(p.graph, backward->node(v).name)) seeds.insert(backward->node(v).name);
  }
  // Data from files. Files with more leading dims than the graph's first (batch) dim are
  // broadcast against each other and folded into it, as torch's sdpa takes (..., N, D).
  std::vector<std::pair<std::string, std::size_t>> folded;  // input, leading dims folded
  for (const auto& [name, file] : r.in) {
    const ir::Node* n = find_input(p.graph, name);
    if (!n && seeds.contains(name)) continue;  // a seed of the backward, below
    if (!n) {
      std::string seed_list;
      for (const auto& sd : seeds) seed_list += (seed_list.empty() ? "" : ", ") + sd;
      throw UsageError("--in " + name + "=" + file + ": " + p.title + " has no input '" + name + "' (inputs: " + input_list(p.graph) +
                       (seeds.empty() ? ""
                        : r.grad      ? "; gradient seeds with --grad: " + seed_list
                                      : "; tangents with --jvp: " + seed_list) +
                       ")");
    }
    const Tensor& t = files.at(name).tensor;
    const bool batch_first = n->shape.rank >= 1 && ir::is_symbol(n->shape[0]) && p.graph.dim_name(n->shape[0]) == "B";
    if (spec && batch_first && t.rank() > n->shape.rank) folded.emplace_back(name, static_cast<std::size_t>(t.rank() - n->shape.rank + 1));
  }
  std::map<std::string, Tensor> loaded;
  for (const auto& [name, f] : files) loaded.emplace(name, f.tensor);
  if (!folded.empty()) {
    std::vector<std::int64_t> batch;
    for (const auto& [name, lead] : folded) {
      const auto& s = loaded.at(name).shape();
      auto b = broadcast_shapes(batch, {s.begin(), s.begin() + static_cast<std::ptrdiff_t>(lead)});
      if (!b)
        throw UsageError(r.in.at(name) + ": leading dims " + shape_string({s.begin(), s.begin() + static_cast<std::ptrdiff_t>(lead)}) +
                         " of input '" + name + "' do not broadcast with the other inputs' " + shape_string(batch));
      batch = *b;
    }
    for (const auto& [name, lead] : folded) loaded[name] = fold_batch(loaded.at(name), lead, batch);
    p.batch = batch;
  }
  int promoted = -1;
  for (const auto& [name, file] : r.in) {
    const ir::Node* n = find_input(p.graph, name);
    if (!n) continue;
    Tensor t = loaded.at(name);
    const int added = fit(p.graph, *n, t, file, files.at(name).stored);
    promoted = promoted < 0 ? added : std::min(promoted, added);
    bind_dims(p.graph, *n, t, dims);
    p.inputs.emplace(name, std::move(t));
    p.sources[name] = file;
  }
  p.promoted = std::max(promoted, 0);
  // Parameters from the weights file: every non-data input of a model, or those inputs of a graph
  // file that no --in gives and the weights name.
  std::vector<std::string> parameters;
  for (ir::ValueId v : p.graph.inputs()) {
    const std::string& name = p.graph.node(v).name;
    if (spec ? std::find(p.data.begin(), p.data.end(), name) == p.data.end() : !r.in.contains(name)) parameters.push_back(name);
  }
  if (!r.weights.empty()) {
    if (parameters.empty())
      throw UsageError("--weights " + r.weights + ": " + p.title + " has no weights (its inputs are data: " + input_list(p.graph) + ")");
    auto w = load_weights(r.weights);
    for (ir::ValueId v : p.graph.inputs()) {
      const ir::Node& n = p.graph.node(v);
      if (std::find(parameters.begin(), parameters.end(), n.name) == parameters.end() || p.inputs.contains(n.name)) continue;
      auto it = w.find(n.name);
      if (it == w.end() && !spec) continue;  // a graph file's inputs the weights do not name are random
      if (it == w.end()) throw UsageError(r.weights + ": no tensor '" + n.name + "' (" + p.graph.type_string(v) + ")");
      Tensor t = it->second.tensor;
      fit(p.graph, n, t, it->second.file, "");
      bind_dims(p.graph, n, t, dims);  // a checkpoint's embedding size is the model's
      p.inputs.emplace(n.name, std::move(t));
      p.sources[n.name] = it->second.file;
    }
  }
  // A model folder's weights (in the graph's dtype), and its token ids: the prompt's, or random
  // in the vocabulary ([B, T] from --dim, 1 x 8 by default); positions 0..T-1.
  if (pretrained) {
    for (ir::ValueId v : p.graph.inputs()) {
      const ir::Node& n = p.graph.node(v);
      auto it = pretrained->weights.find(n.name);
      if (it == pretrained->weights.end()) continue;
      p.inputs.emplace(n.name, it->second.dtype() == n.dtype ? it->second : it->second.to(n.dtype));
      p.sources[n.name] = r.target;
    }
    if (!p.inputs.contains("input_ids")) {
      Tensor ids;
      if (!r.prompt.empty()) {
        const io::Tokenizer tokenizer = io::Tokenizer::from_folder(r.target);
        const std::vector<std::int32_t> tokens = tokenizer.encode(r.prompt);
        if (tokens.empty()) throw UsageError("--prompt: no tokens");
        ids = Tensor::from<std::int32_t>({1, static_cast<std::int64_t>(tokens.size())}, tokens);
        p.sources["input_ids"] = "--prompt";
      } else {
        const std::int64_t b = dims.contains("B") ? dims.at("B") : 1, t = dims.contains("T") ? dims.at("T") : 8;
        ids = Tensor(DType::i32, {b, t});
        std::uint64_t state = r.seed * 0x9E3779B97F4A7C15ull + 1;
        for (std::int64_t i = 0; i < ids.numel(); ++i) {
          state = state * 6364136223846793005ull + 1442695040888963407ull;
          ids.data<std::int32_t>()[i] = static_cast<std::int32_t>((state >> 33) % static_cast<std::uint64_t>(pretrained->vocab_size));
        }
        p.sources["input_ids"] = "seed " + std::to_string(r.seed);
      }
      p.inputs.emplace("input_ids", std::move(ids));
    }
    const std::vector<std::int64_t> shape = p.inputs.at("input_ids").shape();
    if (shape.size() != 2) throw UsageError("input_ids: expected [batch, tokens], got " + shape_string(shape));
    if (shape[1] > pretrained->max_positions)
      throw UsageError("input_ids: " + std::to_string(shape[1]) + " tokens, more than the model's " + std::to_string(pretrained->max_positions) +
                       " positions");
    dims["B"] = shape[0];  // the gradient seeds' sizes (--grad)
    dims["T"] = shape[1];
    if (!p.inputs.contains("position_ids")) {
      Tensor positions(DType::i32, shape);
      for (std::int64_t i = 0; i < positions.numel(); ++i) positions.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % shape[1]);
      p.inputs.emplace("position_ids", std::move(positions));
      p.sources["position_ids"] = "0.." + std::to_string(shape[1] - 1);
    }
    // An encoder's token types (all 0) and attention mask (every token kept).
    for (const auto& [name, fill] : {std::pair<const char*, std::int32_t>{"token_type_ids", 0}, {"attention_mask", 1}})
      if (find_input(p.graph, name) && !p.inputs.contains(name)) {
        Tensor t(DType::i32, shape);
        std::fill_n(t.data<std::int32_t>(), t.numel(), fill);
        p.inputs.emplace(name, std::move(t));
        p.sources[name] = fill ? "all 1" : "all 0";
      }
  }
  // The rest from the seed: parameters at Xavier scale, data ~ N(0, 1).
  if (!pretrained)
    for (auto& [name, t] : random_parameters(p.graph, p.data, r.seed, with_default_sizes(p.graph, dims)))
      if (!p.inputs.contains(name)) {
        p.sources[name] = "seed " + std::to_string(r.seed);
        p.inputs.emplace(name, std::move(t));
      }
  for (ir::ValueId v : p.graph.inputs())
    if (!p.inputs.contains(p.graph.node(v).name)) p.sources[p.graph.node(v).name] = "seed " + std::to_string(r.seed);
  fill_missing(p.graph, p.inputs, dims, r.seed);
  check_binding(p.graph, p.inputs, p.sources);
  if (backward) {
    for (const auto& [name, file] : r.in)
      if (seeds.contains(name)) {
        const ir::Node* n = find_input(*backward, name);
        Tensor t = loaded.at(name);
        fit(*backward, *n, t, file, files.at(name).stored);
        p.inputs.emplace(name, std::move(t));
        p.sources[name] = file;
      }
    fill_missing(*backward, p.inputs, dims, r.seed + 1);
    for (const auto& sd : seeds)
      if (!p.sources.contains(sd)) p.sources[sd] = "seed " + std::to_string(r.seed + 1);
    p.graph = std::move(*backward);
    check_binding(p.graph, p.inputs, p.sources);
    p.title += r.grad ? " backward" : " forward mode";
  }
  return p;
}

Tensor as_given(const Prepared& p, const Tensor& t) {
  std::vector<std::int64_t> s = t.shape();
  int dropped = 0;
  while (dropped < p.promoted && !s.empty() && s.front() == 1) {
    s.erase(s.begin());
    ++dropped;
  }
  std::int64_t folded = 1;
  for (auto d : p.batch) folded *= d;
  if (!p.batch.empty() && !s.empty() && s.front() == folded) {
    s.erase(s.begin());
    s.insert(s.begin(), p.batch.begin(), p.batch.end());
  }
  return t.reshaped(s);
}

void check_binding(const ir::Graph& g, const backend::TensorMap& inputs, const std::map<std::string, std::string>& sources) {
  try {
    ir::bind_shapes(g, inputs);
  } catch (const ShapeError& e) {
    // Name where each tensor the message mentions came from.
    std::string msg = e.what(), from;
    for (const auto& [name, source] : sources)
      if (msg.find("'" + name + "'") != std::string::npos) from += (from.empty() ? "" : "; ") + name + " from " + source;
    throw ShapeError(from.empty() ? msg : msg + " (" + from + ")");
  }
}

}  // namespace qkv::tool
