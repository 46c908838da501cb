// Graphs and inputs for the qkv commands.
#include "tools/prepare.hpp"

#include <algorithm>
#include <filesystem>

#include "backends/equivalence.hpp"
#include "io/file.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "tools/models/models.hpp"
#include "train/init.hpp"

namespace qkv::tool {

std::map<std::string, std::string> pairs(const std::vector<std::string>& items, const char* what) {
  std::map<std::string, std::string> r;
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError(std::string(what) + " expects NAME=VALUE, got '" + item + "'");
    r[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return r;
}

std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
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
/// with leading dims of size 1 added up to its rank. Returns how many were added.
int fit(const ir::Graph& g, const ir::Node& n, Tensor& t, const std::string& file) {
  if (t.dtype() != n.dtype) {
    if (is_float(t.dtype()) && is_float(n.dtype)) t = t.to(n.dtype);
    else
      throw UsageError(file + ": input '" + n.name + "' must be " + std::string(dtype_name(n.dtype)) + ", got " +
                       std::string(dtype_name(t.dtype())));
  }
  int added = 0;
  if (t.rank() < n.shape.rank) {
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

backend::TensorMap load_weights(const std::string& path) {
  backend::TensorMap w;
  if (std::filesystem::is_directory(path)) {
    for (const auto& e : std::filesystem::directory_iterator(path))
      if (e.path().extension() == ".npy") w.emplace(e.path().stem().string(), io::read_npy(e.path().string()));
    if (w.empty()) throw UsageError(path + ": no .npy files in the folder");
    return w;
  }
  if (!std::filesystem::exists(path)) throw UsageError(path + ": no such file or folder");
  for (auto& [name, t] : io::read_safetensors(path)) w.emplace(name, std::move(t));
  return w;
}

/// Parameters of `g` (the f32 inputs not in `data`) from the seed, as PyTorch's modules start:
/// Xavier-uniform weights, zero biases, norm weights of one.
backend::TensorMap random_parameters(const ir::Graph& g, const std::vector<std::string>& data, std::uint64_t seed) {
  std::vector<std::string> weights, biases, norms;
  for (ir::ValueId v : g.inputs()) {
    const ir::Node& n = g.node(v);
    if (n.dtype != DType::f32 || std::find(data.begin(), data.end(), n.name) != data.end()) continue;
    if (n.name.find("bias") != std::string::npos) biases.push_back(n.name);
    else if (n.name.find("norm") != std::string::npos) norms.push_back(n.name);
    else weights.push_back(n.name);
  }
  backend::TensorMap out = train::initialize(g, weights, {train::Init::xavier_uniform}, seed);
  out.merge(train::initialize(g, biases, {train::Init::zeros}, seed));
  out.merge(train::initialize(g, norms, {train::Init::ones}, seed));
  return out;
}

}  // namespace

void fill_missing(const ir::Graph& graph, backend::TensorMap& given, std::map<std::string, std::int64_t> dims, std::uint64_t seed) {
  for (const auto& [id, name] : graph.symbols())
    if (!graph.derived_dims().contains(id)) dims.try_emplace(name, 8);
  backend::TensorMap random = backend::random_inputs(graph, dims, seed);
  for (auto& [name, t] : random) {
    if (given.contains(name)) continue;
    if (t.dtype() == DType::boolean && t.rank() >= 1) {  // keep the first key of every mask row, so no row is empty
      const std::int64_t last = t.shape().back();
      for (std::int64_t i = 0; i < t.numel(); i += last) t.data<std::uint8_t>()[i] = 1;
    }
    given.emplace(name, std::move(t));
  }
}

Prepared prepare(const Request& r) {
  Prepared p;
  std::map<std::string, std::int64_t> dims;
  for (const auto& [name, value] : r.dims) {
    try {
      dims[name] = std::stoll(value);
    } catch (const std::exception&) {
      throw UsageError("--dim " + name + "=" + value + ": expected a size");
    }
  }
  std::map<std::string, Tensor> files;  // each --in file, read once
  for (const auto& [name, file] : r.in) files.emplace(name, io::read_npy(file));
  if (is_graph_file(r.target)) {
    if (!r.set.empty()) throw UsageError("--set is for built-in models; " + r.target + " is a graph already");
    std::string text = io::read_file(r.target);
    try {
      p.graph = ir::parse_graph(text);
    } catch (const IrError& e) {
      throw UsageError(r.target + ": " + e.what());
    }
    for (ir::ValueId v : p.graph.inputs()) p.data.push_back(p.graph.node(v).name);
    p.title = r.target;
  } else {
    const models::ModelSpec* spec = nullptr;
    models::Options options;
    try {
      spec = &models::find_model(r.target);
      options = models::resolve_options(*spec, r.set);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    for (const auto& [name, size] : spec->dims) dims.try_emplace(name, size);
    p.data = spec->data;
    p.title = spec->name;
    std::string opts;
    for (const auto& [name, value] : options.values()) opts += (opts.empty() ? "" : ", ") + name + "=" + value;
    if (!opts.empty()) p.title += " (" + opts + ")";
    auto build_model = [spec, options](const std::map<std::string, std::int64_t>& d) {
      try {
        return spec->build(options, d);
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    };
    p.graph = build_model(dims);
    // Dims the input files bind (sdpa's default scale reads D), then the graph again with them.
    for (const auto& [name, file] : r.in)
      if (const ir::Node* n = find_input(p.graph, name); n) {
        Tensor t = files.at(name);
        fit(p.graph, *n, t, file);
        bind_dims(p.graph, *n, t, dims);
      }
    p.graph = build_model(dims);
  }
  // Data from files.
  int promoted = -1;
  for (const auto& [name, file] : r.in) {
    if (r.grad && name.size() > 1 && name[0] == 'd') continue;  // seeds of the backward, below
    const ir::Node* n = find_input(p.graph, name);
    if (!n) throw UsageError(p.title + " has no input '" + name + "' (inputs: " + input_list(p.graph) + ")");
    Tensor t = files.at(name);
    const int added = fit(p.graph, *n, t, file);
    promoted = promoted < 0 ? added : std::min(promoted, added);
    bind_dims(p.graph, *n, t, dims);
    p.inputs.emplace(name, std::move(t));
    p.sources[name] = file;
  }
  p.promoted = std::max(promoted, 0);
  // Parameters from the weights file.
  if (!r.weights.empty()) {
    backend::TensorMap w = load_weights(r.weights);
    for (ir::ValueId v : p.graph.inputs()) {
      const ir::Node& n = p.graph.node(v);
      if (std::find(p.data.begin(), p.data.end(), n.name) != p.data.end() || p.inputs.contains(n.name)) continue;
      auto it = w.find(n.name);
      if (it == w.end()) throw UsageError(r.weights + ": no tensor '" + n.name + "' (" + p.graph.type_string(v) + ")");
      Tensor t = it->second;
      fit(p.graph, n, t, r.weights);
      p.inputs.emplace(n.name, std::move(t));
      p.sources[n.name] = r.weights;
    }
  }
  // The rest from the seed: parameters at Xavier scale, data ~ N(0, 1).
  for (auto& [name, t] : random_parameters(p.graph, p.data, r.seed))
    if (!p.inputs.contains(name)) {
      p.sources[name] = "seed " + std::to_string(r.seed);
      p.inputs.emplace(name, std::move(t));
    }
  for (ir::ValueId v : p.graph.inputs())
    if (!p.inputs.contains(p.graph.node(v).name)) p.sources[p.graph.node(v).name] = "seed " + std::to_string(r.seed);
  fill_missing(p.graph, p.inputs, dims, r.seed);
  if (r.grad) {
    std::vector<std::string> wrt, seeds;
    for (ir::ValueId v : p.graph.inputs())
      if (is_float(p.graph.node(v).dtype)) wrt.push_back(p.graph.node(v).name);
    for (const auto& [name, v] : p.graph.outputs())
      if (is_float(p.graph.node(v).dtype)) seeds.push_back(name);
    ir::Graph backward = ir::build_backward(p.graph, {"", wrt, seeds});
    // Seeds d<output> from --in, or random.
    for (const auto& [name, file] : r.in)
      if (name.size() > 1 && name[0] == 'd' && !find_input(p.graph, name)) {
        const ir::Node* n = find_input(backward, name);
        if (!n) throw UsageError(p.title + " --grad has no input '" + name + "' (seeds are d<output>)");
        Tensor t = files.at(name);
        fit(backward, *n, t, file);
        p.inputs.emplace(name, std::move(t));
        p.sources[name] = file;
      }
    fill_missing(backward, p.inputs, dims, r.seed + 1);
    p.graph = std::move(backward);
    p.title += " backward";
  }
  return p;
}

}  // namespace qkv::tool
