// Sums of zero-padded pieces become one concatenation. The gradient of a tensor read through
// slices along one axis (a packed QKV projection's weight and bias) is, as autodiff accumulates
// it, one zero-padded copy per slice added up:
//   concat(dq, zeros) + concat(zeros, dk, zeros) + concat(zeros, dv)
// An add whose operands are both laid out as pieces along the same axis (nested concats with
// static extents, zeros where an operand is a broadcast zero) becomes one concatenation when the
// pieces line up where both have values: each piece with a value is kept (added to the other
// operand's piece where that has one over the same range), and zeros stay where neither has one.
// The three copies above become concat(dq, dk, dv): no zero tensors, no adds, and the value is
// the same to the bit (x + 0 = x).
#include <algorithm>
#include <optional>

#include "ir/passes/passes.hpp"

namespace qkv::ir {

namespace {

/// A range [begin, begin + extent) along the axis: a value's, or zeros (value < 0).
struct Piece {
  ValueId value;
  Dim begin, extent;
  Dim end() const { return begin + extent; }
};

/// The scalar 0 constant value `v` broadcasts, or -1 when it is not zeros.
ValueId zero_source(const Graph& g, ValueId v) {
  const Node& n = g.node(v);
  if (n.op == Op::constant) return n.attrs.value == 0.0 && n.attrs.rsqrt_of == 0 ? v : -1;
  if (n.op == Op::broadcast_to) return zero_source(g, n.inputs[0]);
  return -1;
}

/// Appends the pieces `v` is made of along `axis`, starting at `begin`; false when an extent is
/// a named dim (the ranges could not be compared).
bool collect(const Graph& g, ValueId v, int axis, Dim begin, std::vector<Piece>& out) {
  const Node& n = g.node(v);
  const Dim extent = n.shape[axis];
  if (is_symbol(extent)) return false;
  if (n.op == Op::concat && n.attrs.axis == axis)
    return collect(g, n.inputs[0], axis, begin, out) && collect(g, n.inputs[1], axis, begin + g.node(n.inputs[0]).shape[axis], out);
  out.push_back({zero_source(g, v) >= 0 ? -1 : v, begin, extent});
  return true;
}

std::optional<std::vector<Piece>> pieces(const Graph& g, ValueId v, int axis) {
  std::vector<Piece> out;
  if (!collect(g, v, axis, 0, out)) return std::nullopt;
  return out;
}

/// Whether every piece with a value in `mine` meets in `other` only zeros or one piece with a
/// value over exactly its range.
bool lines_up(const std::vector<Piece>& mine, const std::vector<Piece>& other) {
  for (const Piece& p : mine) {
    if (p.value < 0) continue;
    for (const Piece& q : other)
      if (q.value >= 0 && q.begin < p.end() && p.begin < q.end() && (q.begin != p.begin || q.extent != p.extent)) return false;
  }
  return true;
}

/// The rewrite of add(a, b), or -1 to keep it.
ValueId fold(Graph& g, ValueId a, ValueId b) {
  // Copies, not references: g.add below may move the nodes.
  const Node na = g.node(a), nb = g.node(b);
  if (!(na.shape == nb.shape) || na.dtype != DType::f32 || nb.dtype != DType::f32) return -1;  // the zeros are f32
  const Node& joined = na.op == Op::concat ? na : nb;
  if (joined.op != Op::concat) return -1;
  const int axis = joined.attrs.axis;
  const Shape shape = na.shape;
  const auto pa = pieces(g, a, axis), pb = pieces(g, b, axis);
  if (!pa || !pb || !lines_up(*pa, *pb) || !lines_up(*pb, *pa)) return -1;
  auto has_zeros = [](const std::vector<Piece>& ps) { return std::any_of(ps.begin(), ps.end(), [](const Piece& p) { return p.value < 0; }); };
  if (!has_zeros(*pa) && !has_zeros(*pb)) return -1;  // concat(a1, a2) + concat(b1, b2): nothing saved

  // The pieces with values, in order (pieces over the same range added), and zeros between them.
  std::vector<Piece> valued;
  for (const Piece& p : *pa)
    if (p.value >= 0) valued.push_back(p);
  for (const Piece& q : *pb) {
    if (q.value < 0) continue;
    auto same = std::find_if(valued.begin(), valued.end(), [&](const Piece& p) { return p.begin == q.begin; });
    if (same != valued.end()) same->value = g.add(Op::add, {same->value, q.value});
    else valued.push_back(q);
  }
  std::sort(valued.begin(), valued.end(), [](const Piece& x, const Piece& y) { return x.begin < y.begin; });
  auto zeros = [&](Dim extent) {
    Shape s = shape;
    s[axis] = extent;
    return g.add(Op::broadcast_to, {g.constant(0.0)}, shape_attrs(s));
  };
  std::vector<ValueId> parts;
  Dim at = 0;
  for (const Piece& p : valued) {
    if (p.begin > at) parts.push_back(zeros(p.begin - at));
    parts.push_back(p.value);
    at = p.end();
  }
  if (at < shape[axis]) parts.push_back(zeros(shape[axis] - at));
  Attrs join;
  join.axis = axis;
  ValueId r = parts.front();
  for (std::size_t i = 1; i < parts.size(); ++i) r = g.add(Op::concat, {r, parts[i]}, join);
  return r;
}

}  // namespace

Graph fold_padded_sums(const Graph& g) {
  return rebuild(g, [](Graph& out, ValueId, const Node& n, std::span<const ValueId> in) -> ValueId {
    if (n.op != Op::add) return -1;
    return fold(out, in[0], in[1]);
  });
}

}  // namespace qkv::ir
