// Shape binding.
#include "ir/bind.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

namespace qkv::ir {

std::vector<std::int64_t> to_vector(const Shape& s) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(s.rank));  // one allocation: a run's outputs are made of these
  for (int i = 0; i < s.rank; ++i) v[static_cast<std::size_t>(i)] = s[i];
  return v;
}

namespace {

/// a op b of bound sizes, or nothing for a quotient that is not whole; past 63 bits a ShapeError.
std::optional<std::int64_t> apply(DimOp op, std::int64_t a, std::int64_t b) {
  std::optional<std::int64_t> r = size_of(op, a, b);
  if (!r && op != DimOp::quotient)
    throw ShapeError("a dim's size " + std::to_string(a) + (op == DimOp::sum ? " + " : " * ") + std::to_string(b) + " exceeds 63 bits");
  return r;
}

/// The size of dim `d`: a size itself; a symbol `known` gives a size for (named, or a derived dim
/// an input binds directly); otherwise a derived dim from its parts. A quotient must be exact.
template <class Known> std::int64_t evaluate(const Graph& g, Dim d, const Known& known) {
  if (!is_symbol(d)) return d;
  if (std::optional<std::int64_t> v = known(d)) return *v;
  auto p = g.derived_dims().find(d);
  if (p == g.derived_dims().end()) throw ShapeError("dim " + g.dim_name(d) + " is bound by no input");
  const std::int64_t a = evaluate(g, p->second.a, known), b = evaluate(g, p->second.b, known);
  if (std::optional<std::int64_t> v = apply(p->second.op, a, b)) return *v;
  throw ShapeError("dim " + g.dim_name(d) + ": " + g.dim_name(p->second.a) + " = " + std::to_string(a) + " is not divisible by " +
                   (is_symbol(p->second.b) ? g.dim_name(p->second.b) + " = " : "") + std::to_string(b));
}

}  // namespace

std::int64_t dim_size(const Graph& g, Dim d, const std::map<std::string, std::int64_t>& sizes) {
  return evaluate(g, d, [&](Dim s) -> std::optional<std::int64_t> {
    if (auto it = sizes.find(g.dim_name(s)); it != sizes.end()) return it->second;
    if (g.derived_dims().contains(s)) return std::nullopt;
    throw ShapeError("no size given for dim " + g.dim_name(s));
  });
}

std::int64_t bound_dim(const Graph& g, const std::vector<Shape>& shapes, Dim d) {
  // The inputs found in place (not through Graph::inputs, which allocates): kernels ask this of
  // their scale on every run.
  return evaluate(g, d, [&](Dim s) -> std::optional<std::int64_t> {
    for (std::size_t v = 0; v < g.size(); ++v) {
      const Node& n = g.nodes()[v];
      if (n.op != Op::input) continue;
      for (int i = 0; i < n.shape.rank; ++i)
        if (n.shape[i] == s) return shapes[v][i];
    }
    return std::nullopt;
  });
}

double bound_value(const Graph& g, const Node& n, const std::vector<Shape>& shapes) {
  QKV_ASSERT(n.op == Op::constant, "a constant's value");
  if (n.attrs.rsqrt_of == 0) return n.attrs.value;
  return rsqrt_scaled(n.attrs.value, bound_dim(g, shapes, n.attrs.rsqrt_of));
}

double bound_scale(const Graph& g, const Node& n, const std::vector<Shape>& shapes) {
  QKV_ASSERT(is_fused_attention(n.op), "an attention op's scale");
  if (n.attrs.rsqrt_of == 0) return n.attrs.scale;
  return rsqrt_scaled(n.attrs.scale, bound_dim(g, shapes, n.attrs.rsqrt_of));
}

std::vector<Shape> bind_shapes(const Graph& g, const std::map<std::string, Tensor, std::less<>>& inputs, bool f64_for_f32) {
  std::vector<const Tensor*> in_order;
  for (ValueId v : g.inputs()) {
    auto it = inputs.find(g.node(v).name);
    if (it == inputs.end()) throw ShapeError("missing input '" + g.node(v).name + "' (" + g.type_string(v) + ")");
    in_order.push_back(&it->second);
  }
  if (in_order.size() != inputs.size()) {
    for (const auto& [name, t] : inputs) {
      bool known = false;
      for (ValueId v : g.inputs()) known |= g.node(v).name == name;
      if (!known) throw ShapeError("graph has no input '" + name + "'");
    }
  }
  return bind_shapes(g, in_order, f64_for_f32);
}

std::vector<Shape> bind_shapes(const Graph& g, const std::vector<const Tensor*>& inputs, bool f64_for_f32) {
  if (inputs.size() != g.inputs().size())
    throw ShapeError(std::to_string(inputs.size()) + " input tensors for a graph of " + std::to_string(g.inputs().size()) + " inputs");
  std::map<Dim, std::pair<std::int64_t, std::string>> bound;  // symbol -> (value, input that bound it)
  std::vector<Shape> shapes(g.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const ValueId v = g.inputs()[k];
    const Node& n = g.node(v);
    const Tensor& t = *inputs[k];
    std::string expected = g.type_string(v);
    if (t.dtype() != n.dtype && !(f64_for_f32 && n.dtype == DType::f32 && t.dtype() == DType::f64))
      throw ShapeError("input '" + n.name + "': expected " + expected + ", got " + t.type_string() + " (dtype differs)");
    if (t.rank() != n.shape.rank) throw ShapeError("input '" + n.name + "': expected " + expected + ", got " + t.type_string() + " (rank differs)");
    Shape s;
    for (int i = 0; i < n.shape.rank; ++i) {
      Dim d = n.shape[i];
      std::int64_t actual = t.shape()[static_cast<std::size_t>(i)];
      if (!is_symbol(d)) {
        if (d != actual)
          throw ShapeError("input '" + n.name + "': expected " + expected + ", got " + t.type_string() + " (dim " + std::to_string(i) + " is " +
                           std::to_string(actual) + ", must be " + std::to_string(d) + ")");
      } else if (auto [b, inserted] = bound.try_emplace(d, actual, n.name); !inserted && b->second.first != actual) {
        throw ShapeError("input '" + n.name + "': dim " + g.dim_name(d) + " is " + std::to_string(actual) + ", but input '" + b->second.second +
                         "' set it to " + std::to_string(b->second.first));
      }
      s.push_back(actual);
    }
    shapes[static_cast<std::size_t>(v)] = s;
  }
  // A symbol's value: bound by an input, or a derived dim's from its parts.
  auto known = [&](Dim d) -> std::optional<std::int64_t> {
    if (auto b = bound.find(d); b != bound.end()) return b->second.first;
    return std::nullopt;
  };
  // A derived dim an input binds (a weight [3*E, E]) must agree with its parts where they are bound.
  for (const auto& entry : bound) {
    const Dim d = entry.first;
    const auto& b = entry.second;
    auto p = g.derived_dims().find(d);
    if (p == g.derived_dims().end()) continue;
    auto parts_bound = [&](auto& self, Dim x) -> bool {
      if (!is_symbol(x) || (x != d && bound.contains(x))) return true;
      auto q = g.derived_dims().find(x);
      return q != g.derived_dims().end() && self(self, q->second.a) && self(self, q->second.b);
    };
    if (!parts_bound(parts_bound, p->second.a) || !parts_bound(parts_bound, p->second.b)) continue;
    auto without_d = [&](Dim x) { return x == d ? std::nullopt : known(x); };
    const DerivedDim& def = p->second;
    const std::optional<std::int64_t> expected = apply(def.op, evaluate(g, def.a, without_d), evaluate(g, def.b, without_d));
    if (expected == b.first) continue;
    std::string parts;
    for (Dim x : {def.a, def.b})
      if (is_symbol(x)) parts += (parts.empty() ? "" : ", ") + g.dim_name(x) + " = " + std::to_string(evaluate(g, x, without_d));
    throw ShapeError("input '" + b.second + "': dim " + g.dim_name(d) + " is " + std::to_string(b.first) + ", but " + parts +
                     " (from the other inputs) make it " + (expected ? std::to_string(*expected) : "no whole size"));
  }
  auto resolve = [&](const Shape& s, const Node& n) {
    Shape r = s;
    try {
      for (int i = 0; i < r.rank; ++i) r[i] = evaluate(g, r[i], known);
    } catch (const ShapeError& e) {
      throw ShapeError(std::string(op_name(n.op)) + ": " + e.what());
    }
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
