// Shape and dtype rules of every op, usable in constant expressions: the DSL evaluates them at
// compile time on static dims, the graph builder at run time, with the same code.
#pragma once

#include <span>
#include <string_view>

#include "ir/op.hpp"

namespace qkv::ir {

/// Why a shape or dtype rule rejected its operands.
enum class ShapeErr : std::uint8_t {
  none,
  rank_too_small,         // operand `operand` has rank `lhs`, the op needs at least `rhs`
  rank_too_large,         // the result would have rank `lhs` > kMaxRank
  inner_dims_differ,      // matmul: contraction dims `lhs` vs `rhs`
  not_broadcastable,      // dims `lhs` vs `rhs` at result axis `axis`
  axis_out_of_range,      // axis `lhs` for rank `rhs`
  bad_permutation,        // perm is not a permutation of 0..rank-1
  element_count_differs,  // reshape: `lhs` elements into `rhs`
  not_float,              // operand `operand` must be a float (f32, f64, f16, bf16)
  not_bool,               // operand `operand` (a condition) must be bool
  dtypes_differ,          // operands of one computation must share a dtype
  not_integer,            // operand `operand` must be i32
  not_broadcast_target,   // operand `operand` does not broadcast to a shape: dims (or ranks) `lhs` vs `rhs` at axis `axis`
  bad_range,              // slice: [lhs, rhs) is not within the axis; or an attribute out of range
  not_castable,           // cast: to f32, f16 or bf16 from one of them, i32 or bool
  dims_differ,            // concat: dims `lhs` vs `rhs` at axis `axis` (outside the joined axis)
  bad_probability,        // dropout_mask: p is not in [0, 1)
};

/// The words an error message uses for `e` ("inner dimensions differ").
constexpr std::string_view shape_err_name(ShapeErr e) {
  switch (e) {
    case ShapeErr::none: return "none";
    case ShapeErr::rank_too_small: return "rank too small";
    case ShapeErr::rank_too_large: return "rank too large";
    case ShapeErr::inner_dims_differ: return "inner dimensions differ";
    case ShapeErr::not_broadcastable: return "shapes do not broadcast";
    case ShapeErr::axis_out_of_range: return "axis out of range";
    case ShapeErr::bad_permutation: return "not a permutation";
    case ShapeErr::element_count_differs: return "element count differs";
    case ShapeErr::not_float: return "operand is not a float tensor";
    case ShapeErr::not_bool: return "condition is not a bool tensor";
    case ShapeErr::dtypes_differ: return "dtypes differ";
    case ShapeErr::not_integer: return "operand is not an i32 tensor";
    case ShapeErr::not_broadcast_target: return "operand does not broadcast to the target shape";
    case ShapeErr::bad_range: return "range or attribute out of bounds";
    case ShapeErr::not_castable: return "cast takes an f32, f16, bf16, i32 or bool tensor to f32, f16 or bf16";
    case ShapeErr::dims_differ: return "dims differ outside the joined axis";
    case ShapeErr::bad_probability: return "the dropout probability p must lie in [0, 1)";
  }
  return "?";
}

/// What a shape rule knows of an operand: its type.
struct Operand {
  Shape shape;               ///< the operand's shape
  DType dtype = DType::f32;  ///< the operand's dtype
};

/// The result of a rule: a shape and dtype, or an error with the dims that caused it.
struct ShapeResult {
  Shape shape{};                    ///< the result's shape, when ok()
  DType dtype = DType::f32;         ///< the result's dtype, when ok()
  ShapeErr error = ShapeErr::none;  ///< what was wrong, or none
  Dim lhs = 0;                      ///< the first of the dims that disagree (or the bad value)
  Dim rhs = 0;                      ///< the second of the dims that disagree
  int operand = 0;                  ///< the operand at fault
  int axis = 0;                     ///< the axis at fault
  /// Whether the rule accepted the operands.
  constexpr bool ok() const { return error == ShapeErr::none; }
};

namespace rules {

constexpr ShapeResult fail(ShapeErr e, Dim lhs = 0, Dim rhs = 0, int operand = 0, int axis = 0) {
  ShapeResult r;
  r.error = e;
  r.lhs = lhs;
  r.rhs = rhs;
  r.operand = operand;
  r.axis = axis;
  return r;
}

constexpr int normalize_axis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

/// A graph input: the shape and dtype it declares.
constexpr ShapeResult input(std::span<const Operand>, const Attrs& a) { return {a.shape, a.dtype}; }

/// A constant: f32 of its shape.
constexpr ShapeResult constant(std::span<const Operand>, const Attrs& a) { return {a.shape, DType::f32}; }

/// NumPy broadcasting of any number of shapes (right-aligned; 1 stretches).
constexpr ShapeResult broadcast(std::span<const Operand> in) {
  int rank = 0;
  for (const auto& o : in) rank = o.shape.rank > rank ? o.shape.rank : rank;
  ShapeResult r;
  r.shape.rank = rank;
  for (int i = 0; i < rank; ++i) {
    Dim out = 1;
    for (const auto& o : in) {
      int j = i - (rank - o.shape.rank);
      if (j < 0) continue;
      Dim d = o.shape[j];
      if (d == 1) continue;
      if (out == 1) {
        out = d;
      } else if (!dims_compatible(out, d)) {
        return fail(ShapeErr::not_broadcastable, out, d, 0, i);
      } else {
        out = unify_dims(out, d);
      }
    }
    r.shape[i] = out;
  }
  return r;
}

/// Whether operand `at`, x, broadcasts to `target` without enlarging it (x's rank at most
/// target's, each of its dims 1 or target's): ok, or the first dim (or the ranks) that does not.
constexpr ShapeResult broadcasts_to(const Operand& x, const Shape& target, int at) {
  if (x.shape.rank > target.rank) return fail(ShapeErr::not_broadcast_target, x.shape.rank, target.rank, at);
  for (int i = 0; i < x.shape.rank; ++i) {
    const Dim d = x.shape.back(i), t = target.back(i);
    if (d != 1 && (t == 1 || !dims_compatible(d, t))) return fail(ShapeErr::not_broadcast_target, d, t, at, target.rank - 1 - i);
  }
  return {target, x.dtype};
}

/// Operands `first` on are floats of one dtype, the result's. A rank-0 operand (a scalar
/// constant, a temperature) takes the others' dtype, as PyTorch's Python scalars do: x * 0.5
/// stays f16 when x is. Among rank-0 operands alone, a half one sets the dtype (f32 constants
/// are the scalars here, so 0.5 * s is f16 for an f16 scalar s).
constexpr ShapeResult require_float(std::span<const Operand> in, int first) {
  int leader = -1;  // the first operand of rank above 0, whose dtype the others must share
  for (int i = first; i < static_cast<int>(in.size()) && leader < 0; ++i)
    if (in[static_cast<std::size_t>(i)].shape.rank > 0) leader = i;
  for (int i = first; i < static_cast<int>(in.size()) && leader < 0; ++i)
    if (is_half(in[static_cast<std::size_t>(i)].dtype)) leader = i;
  const DType dtype = in[static_cast<std::size_t>(leader < 0 ? first : leader)].dtype;
  for (int i = first; i < static_cast<int>(in.size()); ++i) {
    const Operand& o = in[static_cast<std::size_t>(i)];
    if (!is_float(o.dtype)) return fail(ShapeErr::not_float, 0, 0, i);
    if (o.dtype != dtype && o.shape.rank > 0) return fail(ShapeErr::dtypes_differ, 0, 0, i);
  }
  ShapeResult r;
  r.dtype = dtype;
  return r;
}

constexpr ShapeResult elementwise(std::span<const Operand> in, const Attrs& = {}) {
  const ShapeResult f = require_float(in, 0);
  if (!f.ok()) return f;
  ShapeResult r = broadcast(in);
  r.dtype = f.dtype;
  return r;
}

constexpr ShapeResult compare(std::span<const Operand> in, const Attrs& a) {
  ShapeResult r = elementwise(in, a);
  r.dtype = DType::boolean;
  return r;
}

constexpr ShapeResult broadcast_to(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  const Operand both[2] = {x, {a.shape, x.dtype}};
  ShapeResult r = broadcast(both);
  if (!r.ok()) return r;
  if (r.shape.rank != a.shape.rank) return fail(ShapeErr::not_broadcast_target, x.shape.rank, a.shape.rank);
  for (int i = 0; i < r.shape.rank; ++i)
    if (!dims_compatible(r.shape[i], a.shape[i])) return fail(ShapeErr::not_broadcast_target, r.shape[i], a.shape[i], 0, i);
  return {a.shape, x.dtype};
}

constexpr ShapeResult one_hot(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  if (x.dtype != DType::i32) return fail(ShapeErr::not_integer);
  ShapeResult r{x.shape, DType::f32};
  if (r.shape.rank >= kMaxRank) return fail(ShapeErr::rank_too_large, r.shape.rank + 1);
  r.shape.push_back(a.depth);
  return r;
}

/// ids [...] (i32), table [V, ...] -> [..., ...] in the table's dtype.
constexpr ShapeResult embedding(std::span<const Operand> in, const Attrs&) {
  const Operand& ids = in[0];
  const Operand& table = in[1];
  if (ids.dtype != DType::i32) return fail(ShapeErr::not_integer, 0, 0, 0);
  if (!is_float(table.dtype)) return fail(ShapeErr::not_float, 0, 0, 1);
  if (table.shape.rank < 1) return fail(ShapeErr::rank_too_small, table.shape.rank, 1, 1);
  if (ids.shape.rank + table.shape.rank - 1 > kMaxRank) return fail(ShapeErr::rank_too_large, ids.shape.rank + table.shape.rank - 1);
  ShapeResult r{ids.shape, table.dtype};
  for (int i = 1; i < table.shape.rank; ++i) r.shape.push_back(table.shape[i]);
  return r;
}

constexpr ShapeResult select(std::span<const Operand> in, const Attrs&) {
  if (in[0].dtype != DType::boolean) return fail(ShapeErr::not_bool, 0, 0, 0);
  const ShapeResult f = require_float(in, 1);
  if (!f.ok()) return f;
  ShapeResult r = broadcast(in);
  r.dtype = f.dtype;
  return r;
}

constexpr ShapeResult reduce(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  if (!is_float(x.dtype)) return fail(ShapeErr::not_float);
  int ax = normalize_axis(a.axis, x.shape.rank);
  if (ax < 0 || ax >= x.shape.rank) return fail(ShapeErr::axis_out_of_range, a.axis, x.shape.rank);
  ShapeResult r;
  r.dtype = x.dtype;
  for (int i = 0; i < x.shape.rank; ++i) {
    if (i != ax) r.shape.push_back(x.shape[i]);
    else if (a.keepdim) r.shape.push_back(1);
  }
  return r;
}

constexpr ShapeResult softmax(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  if (!is_float(x.dtype)) return fail(ShapeErr::not_float);
  int ax = normalize_axis(a.axis, x.shape.rank);
  if (ax < 0 || ax >= x.shape.rank) return fail(ShapeErr::axis_out_of_range, a.axis, x.shape.rank);
  return {x.shape, x.dtype};
}

/// sink_softmax(x, sink): x's shape and dtype; the sink, of x's dtype, broadcasts to x's shape
/// with a last dim of 1 (a logit per row).
constexpr ShapeResult sink_softmax(std::span<const Operand> in, const Attrs&) {
  const Operand& x = in[0];
  if (!is_float(x.dtype)) return fail(ShapeErr::not_float);
  if (x.shape.rank < 1) return fail(ShapeErr::rank_too_small, x.shape.rank, 1, 0);
  if (in[1].dtype != x.dtype) return fail(ShapeErr::dtypes_differ, 0, 0, 1);
  Shape rows = x.shape;
  rows[rows.rank - 1] = 1;
  const ShapeResult fits = broadcasts_to(in[1], rows, 1);
  return fits.ok() ? ShapeResult{x.shape, x.dtype} : fits;
}

constexpr ShapeResult matmul(std::span<const Operand> in, const Attrs& at) {
  if (auto r = require_float(in, 0); !r.ok()) return r;
  const Shape& a = in[0].shape;
  const Shape& b = in[1].shape;
  if (a.rank < 2) return fail(ShapeErr::rank_too_small, a.rank, 2, 0);
  if (b.rank < 2) return fail(ShapeErr::rank_too_small, b.rank, 2, 1);
  Dim m = at.transpose_a ? a.back(0) : a.back(1);
  Dim ka = at.transpose_a ? a.back(1) : a.back(0);
  Dim kb = at.transpose_b ? b.back(0) : b.back(1);
  Dim n = at.transpose_b ? b.back(1) : b.back(0);
  if (!dims_compatible(ka, kb)) return fail(ShapeErr::inner_dims_differ, ka, kb);
  Operand batch[2] = {{{}, in[0].dtype}, {{}, in[1].dtype}};
  for (int i = 0; i + 2 < a.rank; ++i) batch[0].shape.push_back(a[i]);
  for (int i = 0; i + 2 < b.rank; ++i) batch[1].shape.push_back(b[i]);
  ShapeResult r = broadcast(batch);
  if (!r.ok()) return r;
  r.shape.push_back(m);
  r.shape.push_back(n);
  r.dtype = in[0].dtype;
  return r;
}

constexpr ShapeResult permute(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  ShapeResult r;
  r.dtype = x.dtype;
  bool seen[kMaxRank] = {};
  for (int i = 0; i < x.shape.rank; ++i) {
    int p = a.perm[static_cast<std::size_t>(i)];
    if (p < 0 || p >= x.shape.rank || seen[p]) return fail(ShapeErr::bad_permutation, p, x.shape.rank);
    seen[p] = true;
    r.shape.push_back(x.shape[p]);
  }
  return r;
}

constexpr ShapeResult reshape(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  if (x.shape.is_static() && a.shape.is_static() && x.shape.numel() != a.shape.numel())
    return fail(ShapeErr::element_count_differs, x.shape.numel(), a.shape.numel());
  return {a.shape, x.dtype};
}

/// attention: out = softmax(q kT) v; with a mask, the mask must broadcast to the scores' shape.
constexpr ShapeResult attention(std::span<const Operand> in, const Attrs& a) {
  if (a.window < 0) return fail(ShapeErr::bad_range, a.window);
  ir::Attrs tb;
  tb.transpose_b = true;
  const Operand qk[2] = {in[0], in[1]};
  ShapeResult scores = matmul(qk, tb);
  if (!scores.ok()) return scores;
  if (in.size() == 4) {
    if (in[3].dtype != DType::boolean) return fail(ShapeErr::not_bool, 0, 0, 3);
    const Operand sm[2] = {{scores.shape, scores.dtype}, in[3]};
    ShapeResult b = broadcast(sm);
    if (!b.ok()) return b;
    if (!(b.shape == scores.shape)) return fail(ShapeErr::not_broadcastable, b.shape.rank, scores.shape.rank, 3);
  }
  const Operand sv[2] = {{scores.shape, scores.dtype}, in[2]};
  return matmul(sv, {});
}

/// attention_lse(q, k [, mask]): the masked scores' shape with one column, [..,N,1].
constexpr ShapeResult attention_lse(std::span<const Operand> in, const Attrs& a) {
  const Operand q = in[0], k = in[1];
  if (k.shape.rank < 2) return fail(ShapeErr::rank_too_small, k.shape.rank, 2, 1);
  Shape vs = k.shape;  // a stand-in v [..,M,1] makes the forward rule give [..,N,1]
  vs[vs.rank - 1] = 1;
  if (in.size() == 3) {
    const Operand args[4] = {q, k, {vs, k.dtype}, in[2]};
    ShapeResult r = attention(args, a);
    if (r.operand == 3) r.operand = 2;  // the mask's place here
    return r;
  }
  const Operand args[3] = {q, k, {vs, k.dtype}};
  return attention(args, a);
}

/// attention's rule over (q, k, v) = operands 0, 1, 2 and, with seven operands, the keep-mask
/// at operand 6 (where attention_grad and attention_jvp take it).
constexpr ShapeResult attention_with_mask_at_6(std::span<const Operand> in, const Attrs& a) {
  Operand fwd[4] = {in[0], in[1], in[2], {}};
  if (in.size() == 7) fwd[3] = in[6];
  ShapeResult y = attention(std::span<const Operand>(fwd, in.size() == 7 ? 4 : 3), a);
  if (!y.ok() && y.operand == 3) y.operand = 6;  // the mask's place here
  return y;
}

/// attention_grad(q, k, v, dy, lse, delta [, mask]) {wrt}: operand wrt's last two dims under the
/// broadcast batch dims; dy has the forward's shape, lse and delta that shape with one column.
constexpr ShapeResult attention_grad(std::span<const Operand> in, const Attrs& a) {
  if (a.wrt < 0 || a.wrt > 2) return fail(ShapeErr::bad_range, a.wrt, 2);
  const ShapeResult y = attention_with_mask_at_6(in, a);
  if (!y.ok()) return y;
  Shape row = y.shape;
  row[row.rank - 1] = 1;
  const Shape expected[3] = {y.shape, row, row};
  for (int i = 0; i < 3; ++i) {
    const Operand& o = in[static_cast<std::size_t>(3 + i)];
    if (o.dtype != y.dtype) return fail(ShapeErr::dtypes_differ, 0, 0, 3 + i);
    if (o.shape.rank != expected[i].rank) return fail(ShapeErr::not_broadcastable, o.shape.rank, expected[i].rank, 3 + i);
    for (int d = 0; d < o.shape.rank; ++d)
      if (!dims_compatible(o.shape[d], expected[i][d])) return fail(ShapeErr::not_broadcastable, o.shape[d], expected[i][d], 3 + i, d);
  }
  const Shape& w = in[static_cast<std::size_t>(a.wrt)].shape;
  Shape r = y.shape;
  r[r.rank - 2] = w.back(1);
  r[r.rank - 1] = w.back(0);
  return {r, y.dtype};
}

/// The modifier tensors of a flex attention op, operands `first` on, each broadcasting to the
/// scores q kT (operands 0 and 1): the scores' shape when they do.
/// Whether a and b have the same rank and batch dims (all but the last two).
constexpr bool same_batch(const Shape& a, const Shape& b) {
  if (a.rank != b.rank) return false;
  for (int i = 0; i + 2 < a.rank; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

/// With dropout (attribute p in [0, 1), nonzero), the last operand is the seed, an i32 scalar;
/// with a sink, the operand before it is the sink logits, a float broadcasting to [..,N,1].
constexpr ShapeResult modifier_tensors(std::span<const Operand> in, std::size_t first, const Attrs& a) {
  if (!(a.dropout >= 0.0 && a.dropout < 1.0)) return fail(ShapeErr::bad_probability);
  std::size_t end = in.size();
  const std::size_t trailing = (a.dropout != 0.0 ? 1 : 0) + (a.sink ? 1 : 0);
  if (end < first + trailing) return fail(ShapeErr::rank_too_small, static_cast<std::int64_t>(end), static_cast<std::int64_t>(first + trailing));
  if (a.dropout != 0.0) {
    const Operand& seed = in[--end];
    if (seed.dtype != DType::i32) return fail(ShapeErr::not_integer, 0, 0, static_cast<int>(end));
    if (seed.shape.rank != 0) return fail(ShapeErr::rank_too_large, seed.shape.rank, 0, static_cast<int>(end));
  }
  ir::Attrs tb;
  tb.transpose_b = true;
  const ShapeResult scores = matmul(in.first(2), tb);
  if (!scores.ok()) return scores;
  if (a.sink) {
    const Operand& sink = in[--end];
    Shape rows = scores.shape;
    rows[rows.rank - 1] = 1;
    if (!is_float(sink.dtype)) return fail(ShapeErr::not_float, 0, 0, static_cast<int>(end));
    if (const ShapeResult fits = broadcasts_to(sink, rows, static_cast<int>(end)); !fits.ok()) return fits;
  }
  for (std::size_t i = first; i < end; ++i) {
    const Operand sm[2] = {{scores.shape, DType::f32}, in[i]};
    ShapeResult b = broadcast(sm);
    if (!b.ok()) {
      b.operand = static_cast<int>(i);
      return b;
    }
    if (!(b.shape == scores.shape)) return fail(ShapeErr::not_broadcast_target, b.shape.rank, scores.shape.rank, static_cast<int>(i));
  }
  return {scores.shape, DType::f32};
}

/// flex_attention(q, k, v, t..., [sink], [seed]): attention's shape; each t broadcasts to the scores.
constexpr ShapeResult flex_attention(std::span<const Operand> in, const Attrs& a) {
  const ShapeResult y = attention(in.first(3), a);
  const ShapeResult t = y.ok() ? modifier_tensors(in, 3, a) : y;
  if (!t.ok()) return t;
  // Dropout's bits are keyed by the weights' element index: v may not add batch dims to them.
  if (a.dropout != 0.0 && !same_batch(t.shape, y.shape)) return fail(ShapeErr::dims_differ, t.shape.rank, y.shape.rank, 2);
  return y;
}

/// flex_attention_lse(q, k, t..., [sink]): the scores' shape with one column.
constexpr ShapeResult flex_attention_lse(std::span<const Operand> in, const Attrs& a) {
  const ShapeResult r = attention_lse(in.first(2), a);
  Attrs tensors;
  tensors.sink = a.sink;
  const ShapeResult t = r.ok() ? modifier_tensors(in, 2, tensors) : r;
  return t.ok() ? r : t;
}

/// flex_attention_grad(q, k, v, dy, lse, delta, t..., [seed]) {wrt}: attention_grad's shapes for
/// wrt < 3; the scores' shape [..,N,M] for wrt = 3 + i (ti's gradient before it is summed to ti's shape).
constexpr ShapeResult flex_attention_grad(std::span<const Operand> in, const Attrs& a) {
  const int tensors = static_cast<int>(in.size()) - 6 - (a.dropout != 0.0 ? 1 : 0);
  if (a.wrt < 0 || a.wrt >= 3 + tensors) return fail(ShapeErr::bad_range, a.wrt, 2 + tensors);
  Attrs fixed = a;
  if (a.wrt >= 3) fixed.wrt = 0;
  const ShapeResult r = attention_grad(in.first(6), fixed);
  const ShapeResult t = r.ok() ? modifier_tensors(in, 6, a) : r;
  if (!t.ok()) return t;
  if (a.dropout != 0.0 && !same_batch(t.shape, in[3].shape))
    return fail(ShapeErr::dims_differ, t.shape.rank, in[3].shape.rank, 3);  // as flex_attention's
  return a.wrt >= 3 ? t : r;
}

/// The tangents tq, tk, tv (operands 3, 4, 5) of an attention's tangent op: each of its
/// primal's dtype and shape (q, k, v: operands 0, 1, 2).
constexpr ShapeResult tangents_match(std::span<const Operand> in) {
  for (int i = 0; i < 3; ++i) {
    const Operand &x = in[static_cast<std::size_t>(i)], &t = in[static_cast<std::size_t>(3 + i)];
    if (t.dtype != x.dtype) return fail(ShapeErr::dtypes_differ, 0, 0, 3 + i);
    if (t.shape.rank != x.shape.rank) return fail(ShapeErr::not_broadcast_target, t.shape.rank, x.shape.rank, 3 + i);
    for (int d = 0; d < t.shape.rank; ++d)
      if (!dims_compatible(t.shape[d], x.shape[d])) return fail(ShapeErr::not_broadcast_target, t.shape[d], x.shape[d], 3 + i, d);
  }
  return {};
}

/// attention_jvp(q, k, v, tq, tk, tv [, mask]): attention's shape; each tangent has its
/// primal's dtype and shape.
constexpr ShapeResult attention_jvp(std::span<const Operand> in, const Attrs& a) {
  const ShapeResult y = attention_with_mask_at_6(in, a);
  if (!y.ok()) return y;
  const ShapeResult t = tangents_match(in);
  return t.ok() ? y : t;
}

/// flex_attention_jvp(q, k, v, tq, tk, tv, t..., [sink], [seed]): flex_attention's shape; each
/// tangent has its primal's dtype and shape.
constexpr ShapeResult flex_attention_jvp(std::span<const Operand> in, const Attrs& a) {
  const ShapeResult y = attention(in.first(3), a);
  if (!y.ok()) return y;
  if (const ShapeResult t = tangents_match(in); !t.ok()) return t;
  const ShapeResult t = modifier_tensors(in, 6, a);
  if (!t.ok()) return t;
  if (a.dropout != 0.0 && !same_batch(t.shape, y.shape)) return fail(ShapeErr::dims_differ, t.shape.rank, y.shape.rank, 2);
  return y;
}

constexpr ShapeResult cast(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  if (x.dtype == DType::f64 || a.dtype == DType::f64 || !is_float(a.dtype)) return fail(ShapeErr::not_castable);
  return {x.shape, a.dtype};
}

constexpr ShapeResult slice(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  int ax = normalize_axis(a.axis, x.shape.rank);
  if (ax < 0 || ax >= x.shape.rank) return fail(ShapeErr::axis_out_of_range, a.axis, x.shape.rank);
  const Dim d = x.shape[ax];
  // A named dim's range is checked when the dim is bound (this rule runs again on the sizes).
  if (a.begin < 0 || a.end < a.begin || (!is_symbol(d) && a.end > d)) return fail(ShapeErr::bad_range, a.begin, a.end, 0, ax);
  ShapeResult r{x.shape, x.dtype};
  r.shape[ax] = a.end - a.begin;
  return r;
}

constexpr ShapeResult concat(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  const Operand& y = in[1];
  if (x.dtype != y.dtype) return fail(ShapeErr::dtypes_differ, 0, 0, 1);
  if (x.shape.rank != y.shape.rank) return fail(ShapeErr::dims_differ, x.shape.rank, y.shape.rank, 1);
  int ax = normalize_axis(a.axis, x.shape.rank);
  if (ax < 0 || ax >= x.shape.rank) return fail(ShapeErr::axis_out_of_range, a.axis, x.shape.rank);
  ShapeResult r{x.shape, x.dtype};
  for (int i = 0; i < x.shape.rank; ++i) {
    if (i == ax) r.shape[i] = sum_dims(x.shape[i], y.shape[i]);
    else if (!dims_compatible(x.shape[i], y.shape[i])) return fail(ShapeErr::dims_differ, x.shape[i], y.shape[i], 1, i);
    else r.shape[i] = unify_dims(x.shape[i], y.shape[i]);
  }
  return r;
}

/// cache [..., S, ...], new [..., T, ...] (the other dims equal, one dtype), start i32 [] -> cache's.
constexpr ShapeResult cache_write(std::span<const Operand> in, const Attrs& a) {
  const Operand& cache = in[0];
  const Operand& rows = in[1];
  if (!is_float(cache.dtype)) return fail(ShapeErr::not_float, 0, 0, 0);
  if (rows.dtype != cache.dtype) return fail(ShapeErr::dtypes_differ, 0, 0, 1);
  if (in[2].dtype != DType::i32) return fail(ShapeErr::not_integer, 0, 0, 2);
  if (in[2].shape.rank != 0) return fail(ShapeErr::rank_too_large, in[2].shape.rank, 0, 2);
  if (rows.shape.rank != cache.shape.rank) return fail(ShapeErr::dims_differ, cache.shape.rank, rows.shape.rank, 1);
  const int ax = normalize_axis(a.axis, cache.shape.rank);
  if (ax < 0 || ax >= cache.shape.rank) return fail(ShapeErr::axis_out_of_range, a.axis, cache.shape.rank);
  for (int i = 0; i < cache.shape.rank; ++i)
    if (i != ax && !dims_compatible(cache.shape[i], rows.shape[i])) return fail(ShapeErr::dims_differ, cache.shape[i], rows.shape[i], 1, i);
  return {cache.shape, cache.dtype};
}

/// page_write(pages [P, H, page, D], fresh [B, H, T, D], slots i32 [B, T]): the pages' shape.
constexpr ShapeResult page_write(std::span<const Operand> in, const Attrs&) {
  const Operand& pages = in[0];
  const Operand& fresh = in[1];
  const Operand& slots = in[2];
  if (!is_float(pages.dtype)) return fail(ShapeErr::not_float, 0, 0, 0);
  if (fresh.dtype != pages.dtype) return fail(ShapeErr::dtypes_differ, 0, 0, 1);
  if (slots.dtype != DType::i32) return fail(ShapeErr::not_integer, 0, 0, 2);
  if (pages.shape.rank != 4) return fail(pages.shape.rank < 4 ? ShapeErr::rank_too_small : ShapeErr::rank_too_large, pages.shape.rank, 4, 0);
  if (fresh.shape.rank != 4) return fail(fresh.shape.rank < 4 ? ShapeErr::rank_too_small : ShapeErr::rank_too_large, fresh.shape.rank, 4, 1);
  if (slots.shape.rank != 2) return fail(slots.shape.rank < 2 ? ShapeErr::rank_too_small : ShapeErr::rank_too_large, slots.shape.rank, 2, 2);
  for (int i : {1, 3})  // heads and head dim
    if (!dims_compatible(pages.shape[i], fresh.shape[i])) return fail(ShapeErr::dims_differ, pages.shape[i], fresh.shape[i], 1, i);
  if (!dims_compatible(slots.shape[0], fresh.shape[0])) return fail(ShapeErr::dims_differ, fresh.shape[0], slots.shape[0], 2, 0);
  if (!dims_compatible(slots.shape[1], fresh.shape[2])) return fail(ShapeErr::dims_differ, fresh.shape[2], slots.shape[1], 2, 1);
  return {pages.shape, pages.dtype};
}

/// page_gather(pages [P, H, page, D], table i32 [B, n]): [B, H, n page, D] in the pages' dtype.
constexpr ShapeResult page_gather(std::span<const Operand> in, const Attrs&) {
  const Operand& pages = in[0];
  const Operand& table = in[1];
  if (!is_float(pages.dtype)) return fail(ShapeErr::not_float, 0, 0, 0);
  if (table.dtype != DType::i32) return fail(ShapeErr::not_integer, 0, 0, 1);
  if (pages.shape.rank != 4) return fail(pages.shape.rank < 4 ? ShapeErr::rank_too_small : ShapeErr::rank_too_large, pages.shape.rank, 4, 0);
  if (table.shape.rank != 2) return fail(table.shape.rank < 2 ? ShapeErr::rank_too_small : ShapeErr::rank_too_large, table.shape.rank, 2, 1);
  return {Shape{table.shape[0], pages.shape[1], derived_dim(DimOp::product, table.shape[1], pages.shape[2]), pages.shape[3]}, pages.dtype};
}

constexpr ShapeResult iota(std::span<const Operand> in, const Attrs& a) {
  const Operand& x = in[0];
  int ax = normalize_axis(a.axis, x.shape.rank);
  if (ax < 0 || ax >= x.shape.rank) return fail(ShapeErr::axis_out_of_range, a.axis, x.shape.rank);
  return {x.shape, DType::f32};
}

constexpr ShapeResult dropout_mask(std::span<const Operand> in, const Attrs& a) {
  if (in[1].dtype != DType::i32) return fail(ShapeErr::not_integer, 0, 0, 1);
  if (in[1].shape.rank != 0) return fail(ShapeErr::rank_too_large, in[1].shape.rank, 0, 1);
  if (!(a.dropout >= 0.0 && a.dropout < 1.0)) return fail(ShapeErr::bad_probability);
  // In x's dtype when x is f16 or bf16 (the kept value 1/(1-p) rounded to it), so x * mask
  // stays in x's dtype; f32 otherwise.
  return {in[0].shape, is_half(in[0].dtype) ? in[0].dtype : DType::f32};
}

constexpr ShapeResult causal_mask(std::span<const Operand> in, const Attrs& a) {
  if (a.window < 0) return fail(ShapeErr::bad_range, a.window);
  const Operand& x = in[0];
  if (x.shape.rank < 2) return fail(ShapeErr::rank_too_small, x.shape.rank, 2, 0);
  return {Shape{x.shape.back(1), x.shape.back(0)}, DType::boolean};
}

}  // namespace rules

/// Shape and dtype of `op` applied to `in` (in.size() == arity) with attributes `a`: the rule its
/// registry row names (ops.def's shape column, a function of `rules`).
constexpr ShapeResult infer_shape(Op op, std::span<const Operand> in, const Attrs& a) {
  ShapeResult r;
  switch (op) {
#define QKV_SHAPE_RULE(id, arity, category, attrs, shape_rule, ...) \
  case Op::id: r = rules::shape_rule(in, a); break;
    QKV_OPS(QKV_SHAPE_RULE)
#undef QKV_SHAPE_RULE
  }
  if (r.ok() && r.shape.rank > kMaxRank) return rules::fail(ShapeErr::rank_too_large, r.shape.rank);
  return r;
}

}  // namespace qkv::ir
