// Shape binding.
#include "ir/bind.hpp"

#include <algorithm>
#include <cmath>

namespace qkv::ir {

std::vector<std::int64_t> to_vector(const Shape& s) {
  std::vector<std::int64_t> v;
  for (int i = 0; i < s.rank; ++i) v.push_back(s[i]);
  return v;
}

std::int64_t bound_dim(const Graph& g, const std::vector<Shape>& shapes, Dim d) {
  if (!is_symbol(d)) return d;
  if (auto p = g.derived_dims().find(d); p != g.derived_dims().end())
    return bound_dim(g, shapes, p->second.first) + bound_dim(g, shapes, p->second.second);
  for (ValueId v : g.inputs()) {
    const Node& n = g.node(v);
    for (int i = 0; i < n.shape.rank; ++i)
      if (n.shape[i] == d) return shapes[static_cast<std::size_t>(v)][i];
  }
  throw ShapeError("dim " + g.dim_name(d) + " is bound by no input");
}

double bound_value(const Graph& g, const Node& n, const std::vector<Shape>& shapes) {
  if (n.attrs.rsqrt_of == 0) return n.attrs.value;
  return n.attrs.value / std::sqrt(static_cast<double>(std::max<std::int64_t>(bound_dim(g, shapes, n.attrs.rsqrt_of), 1)));
}

std::vector<Shape> bind_shapes(const Graph& g, const std::map<std::string, Tensor, std::less<>>& inputs, bool f64_for_f32) {
  std::map<Dim, std::pair<std::int64_t, std::string>> bound;  // symbol -> (value, input that bound it)
  std::vector<Shape> shapes(g.size());
  std::size_t used = 0;
  for (ValueId v : g.inputs()) {
    const Node& n = g.node(v);
    auto it = inputs.find(n.name);
    if (it == inputs.end()) throw ShapeError("missing input '" + n.name + "' (" + g.type_string(v) + ")");
    ++used;
    const Tensor& t = it->second;
    std::string expected = g.type_string(v);
    if (t.dtype() != n.dtype && !(f64_for_f32 && n.dtype == DType::f32 && t.dtype() == DType::f64))
      throw ShapeError("input '" + n.name + "': expected " + expected + ", got " + t.type_string() + " (dtype differs)");
    if (t.rank() != n.shape.rank)
      throw ShapeError("input '" + n.name + "': expected " + expected + ", got " + t.type_string() + " (rank differs)");
    Shape s;
    for (int i = 0; i < n.shape.rank; ++i) {
      Dim d = n.shape[i];
      std::int64_t actual = t.shape()[static_cast<std::size_t>(i)];
      if (!is_symbol(d)) {
        if (d != actual)
          throw ShapeError("input '" + n.name + "': expected " + expected + ", got " + t.type_string() + " (dim " +
                           std::to_string(i) + " is " + std::to_string(actual) + ", must be " + std::to_string(d) + ")");
      } else if (auto [b, inserted] = bound.try_emplace(d, actual, n.name); !inserted && b->second.first != actual) {
        throw ShapeError("input '" + n.name + "': dim " + g.dim_name(d) + " is " + std::to_string(actual) + ", but input '" +
                         b->second.second + "' set it to " + std::to_string(b->second.first));
      }
      s.push_back(actual);
    }
    shapes[static_cast<std::size_t>(v)] = s;
  }
  if (used != inputs.size()) {
    for (const auto& [name, t] : inputs) {
      bool known = false;
      for (ValueId v : g.inputs()) known |= g.node(v).name == name;
      if (!known) throw ShapeError("graph has no input '" + name + "'");
    }
  }
  // A symbol's value: bound by an input, or (a derived dim) the sum of its parts.
  auto value_of = [&](auto& self, Dim d, const Node& n) -> std::int64_t {
    if (!is_symbol(d)) return d;
    if (auto b = bound.find(d); b != bound.end()) return b->second.first;
    if (auto p = g.derived_dims().find(d); p != g.derived_dims().end())
      return self(self, p->second.first, n) + self(self, p->second.second, n);
    throw ShapeError(std::string(op_name(n.op)) + ": dim " + g.dim_name(d) + " is bound by no input");
  };
  auto resolve = [&](const Shape& s, const Node& n) {
    Shape r = s;
    for (int i = 0; i < r.rank; ++i) r[i] = value_of(value_of, r[i], n);
    return r;
  };
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.op == Op::input) continue;
    std::vector<Operand> operands;
    std::vector<std::string> types;
    for (ValueId v : n.inputs) {
      operands.push_back({shapes[static_cast<std::size_t>(v)], g.node(v).dtype});
      types.push_back(g.type_string(g.node(v).dtype, shapes[static_cast<std::size_t>(v)]));
    }
    Attrs a = n.attrs;
    a.shape = resolve(a.shape, n);
    ShapeResult r = infer_shape(n.op, operands, a);
    if (r.ok() && n.op == Op::reshape && numel(a.shape) != numel(operands[0].shape))
      r = rules::fail(ShapeErr::element_count_differs, numel(operands[0].shape), numel(a.shape));
    if (!r.ok()) throw ShapeError("%" + std::to_string(i) + " " + shape_error_message(n.op, r, types));
    shapes[i] = r.shape;
  }
  return shapes;
}

}  // namespace qkv::ir
