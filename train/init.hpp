// Parameter initialisation from a seed, or from .npy files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.hpp"

namespace qkv::train {

/// How initial values are drawn: constants, uniform in [a, b), normal (mean a, standard deviation
/// b), or Xavier/Glorot's uniform and normal, scaled by the shape's fans.
enum class Init { zeros, ones, uniform, normal, xavier_uniform, xavier_normal };

/// An initialiser and its parameters.
struct InitSpec {
  Init kind = Init::xavier_uniform;  ///< the distribution
  double a = 0.0;                    ///< uniform: low; normal: mean
  double b = 1.0;                    ///< uniform: high; normal: standard deviation
};

/// A tensor of `shape` drawn from `spec`. Xavier/Glorot uses fan_in = shape[-2] and fan_out =
/// shape[-1] (weights applied as x @ W), or the one dim for vectors: bound sqrt(6 / (in + out))
/// for uniform, standard deviation sqrt(2 / (in + out)) for normal.
Tensor initialize(const std::vector<std::int64_t>& shape, const InitSpec& spec, std::uint64_t seed);

/// The named f32 inputs of `g`, initialised from `spec`, each from a seed derived from `seed` and
/// its name (so the order of names does not matter). Named dims take their sizes from `dims` (by
/// name; derived dims from their parts): a shape with a dim it does not size is a ShapeError.
backend::TensorMap initialize(const ir::Graph& g, const std::vector<std::string>& names, const InitSpec& spec, std::uint64_t seed,
                              const std::map<std::string, std::int64_t>& dims = {});

/// Parameters from a folder of NAME.npy files, converted to f32 and checked against `g`'s inputs.
backend::TensorMap load_parameters(const ir::Graph& g, const std::vector<std::string>& names, const std::string& folder);

}  // namespace qkv::train
