// Initialisers.
#include "train/init.hpp"

#include <cmath>
#include <filesystem>
#include <random>

#include "io/npy.hpp"
#include "ir/bind.hpp"

namespace qkv::train {

Tensor initialize(const std::vector<std::int64_t>& shape, const InitSpec& spec, std::uint64_t seed) {
  Tensor t(DType::f32, shape);
  std::mt19937_64 rng(seed);
  const double fan_in = shape.empty() ? 1.0 : static_cast<double>(shape.size() >= 2 ? shape[shape.size() - 2] : shape.back());
  const double fan_out = shape.empty() ? 1.0 : static_cast<double>(shape.back());
  auto fill = [&](auto&& dist) {
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(dist(rng));
  };
  switch (spec.kind) {
    case Init::zeros: break;
    case Init::ones: fill([](auto&) { return 1.0; }); break;
    case Init::uniform: fill(std::uniform_real_distribution<double>(spec.a, spec.b)); break;
    case Init::normal: fill(std::normal_distribution<double>(spec.a, spec.b)); break;
    case Init::xavier_uniform: {
      const double bound = std::sqrt(6.0 / (fan_in + fan_out));
      fill(std::uniform_real_distribution<double>(-bound, bound));
      break;
    }
    case Init::xavier_normal: fill(std::normal_distribution<double>(0.0, std::sqrt(2.0 / (fan_in + fan_out)))); break;
  }
  return t;
}

namespace {
const ir::Node& find_input(const ir::Graph& g, const std::string& name) {
  for (ir::ValueId v : g.inputs())
    if (g.node(v).name == name) return g.node(v);
  throw ShapeError("parameter '" + name + "': the graph has no such input");
}
}  // namespace

backend::TensorMap initialize(const ir::Graph& g, const std::vector<std::string>& names, const InitSpec& spec, std::uint64_t seed,
                              const std::map<std::string, std::int64_t>& dims) {
  backend::TensorMap r;
  for (const auto& name : names) {
    const ir::Node& n = find_input(g, name);
    if (n.dtype != DType::f32) throw ShapeError("parameter '" + name + "' (" + g.type_string(n.dtype, n.shape) + ") is not f32");
    std::vector<std::int64_t> shape;
    try {
      for (int i = 0; i < n.shape.rank; ++i) shape.push_back(ir::dim_size(g, n.shape[i], dims));
    } catch (const ShapeError& e) {
      throw ShapeError("parameter '" + name + "' (" + g.type_string(n.dtype, n.shape) + "): " + e.what());
    }
    std::uint64_t h = seed * 1099511628211ull;
    for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    r.emplace(name, initialize(shape, spec, h));
  }
  return r;
}

backend::TensorMap load_parameters(const ir::Graph& g, const std::vector<std::string>& names, const std::string& folder) {
  backend::TensorMap r;
  for (const auto& name : names) {
    const ir::Node& n = find_input(g, name);
    Tensor t = io::read_npy((std::filesystem::path(folder) / (name + ".npy")).string());
    if (t.dtype() == DType::boolean || t.dtype() == DType::i32) throw IoError(folder + "/" + name + ".npy: parameters are float arrays");
    t = t.to(DType::f32);
    if (n.shape.is_static() && t.shape() != ir::to_vector(n.shape))
      throw ShapeError(folder + "/" + name + ".npy: parameter '" + name + "' has shape " + t.type_string() + ", the model needs " +
                       g.type_string(n.dtype, n.shape));
    r.emplace(name, std::move(t));
  }
  return r;
}

}  // namespace qkv::train
