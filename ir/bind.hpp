// Binding a graph's symbolic dims to the shapes of the tensors it runs on.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/tensor.hpp"

namespace qkv::ir {

/// The concrete shape of every node when the graph runs on `inputs`. Checks that every input is
/// given with its declared dtype and rank, that static dims match, that each symbol gets one
/// value, and re-runs each node's shape rule on the concrete shapes. Throws ShapeError naming
/// the tensor, op and dims; extra tensors the graph has no input for are an error too.
/// With `f64_for_f32`, f64 tensors are accepted for f32 inputs (the reference backend's
/// double-precision mode, for finite differences).
std::vector<Shape> bind_shapes(const Graph& g, const std::map<std::string, Tensor, std::less<>>& inputs, bool f64_for_f32 = false);
/// The same for the tensors of the graph's inputs in their order (g.inputs()), read where they
/// are: what an executable binds each plan with, its held state (a model's weights and its
/// key/value cache) among them, without copying a tensor.
std::vector<Shape> bind_shapes(const Graph& g, const std::vector<const Tensor*>& inputs, bool f64_for_f32 = false);

/// The size of dim `d` of `g` once bound to `shapes` (as bind_shapes gives them): a static dim
/// itself, a named dim the size of an input that declares it, a derived dim from its parts
/// (unless an input declares it). Throws ShapeError for a dim no input binds.
std::int64_t bound_dim(const Graph& g, const std::vector<Shape>& shapes, Dim d);

/// The size of dim `d` of `g` from the sizes of its named dims, by name (derived dims from their
/// parts, or from `sizes` where it names them). Throws ShapeError naming a dim with no size, or a
/// quotient that is not exact.
std::int64_t dim_size(const Graph& g, Dim d, const std::map<std::string, std::int64_t>& sizes);

/// The scale formula of `rsqrt_of`: a value over the square root of a dim's size (at least 1),
/// the default attention scale 1/sqrt(head dim). Every place that binds a dim (binding, the
/// specialize_dims pass, sequence parallelism) scales with this.
inline double rsqrt_scaled(double value, std::int64_t size) { return value / std::sqrt(static_cast<double>(std::max<std::int64_t>(size, 1))); }

/// A constant's value as it runs: scaled by 1/sqrt(size) of its `rsqrt_of` dim if set.
double bound_value(const Graph& g, const Node& n, const std::vector<Shape>& shapes);

/// An attention op's scale as it runs: scaled by 1/sqrt(size) of its `rsqrt_of` dim if set (the
/// default scale of a named head dim).
double bound_scale(const Graph& g, const Node& n, const std::vector<Shape>& shapes);

/// Row-major element count of a concrete shape.
inline std::int64_t numel(const Shape& s) { return s.numel(); }

/// std::vector form of a concrete shape.
std::vector<std::int64_t> to_vector(const Shape& s);

}  // namespace qkv::ir
