// The gradient column of ops.def: each rule(f) it names is a function here, IR ops under a
// one-line math comment; `unbroadcast` undoes NumPy broadcasting of an operand.
#include "ir/gradients.hpp"

#include <cmath>

#include "ir/error.hpp"
#include "ir/region.hpp"

namespace qkv::ir {

ValueId unbroadcast(Graph& g, ValueId grad, const Shape& target) {
  Attrs sum_first;  // axis 0, dropped
  sum_first.keepdim = false;
  while (g.node(grad).shape.rank > target.rank) grad = g.add(Op::reduce_sum, {grad}, sum_first);
  for (int i = 0; i < target.rank; ++i) {
    if (target[i] != 1 || g.node(grad).shape[i] == 1) continue;
    Attrs keep;
    keep.axis = i;
    grad = g.add(Op::reduce_sum, {grad}, keep);
  }
  return grad;
}

namespace {

/// dy of a reduction over `axis`, broadcast back to the operand's shape `xs`.
ValueId expand(Graph& g, ValueId dy, const Attrs& reduce, const Shape& xs) {
  if (!reduce.keepdim) {
    Attrs kept;
    for (int i = 0; i < xs.rank; ++i) kept.shape.push_back(i == reduce.axis ? 1 : xs[i]);
    dy = g.add(Op::reshape, {dy}, kept);
  }
  Attrs to;
  to.shape = xs;
  return g.add(Op::broadcast_to, {dy}, to);
}

Attrs matmul_attrs(bool ta, bool tb) {
  Attrs a;
  a.transpose_a = ta;
  a.transpose_b = tb;
  return a;
}

/// A value of a graph with arithmetic on it: what the registry's derivative column is written in
/// (all of arithmetic and every unary op, whether today's rows use them or not).
struct Term {
  Graph* g;
  ValueId v;
  Term op(Op o, std::vector<ValueId> in) const { return {g, g->add(o, std::move(in))}; }
  Term constant(double c) const { return {g, g->constant(c)}; }
};
[[maybe_unused]] Term operator+(Term a, Term b) { return a.op(Op::add, {a.v, b.v}); }
[[maybe_unused]] Term operator-(Term a, Term b) { return a.op(Op::sub, {a.v, b.v}); }
[[maybe_unused]] Term operator*(Term a, Term b) { return a.op(Op::mul, {a.v, b.v}); }
[[maybe_unused]] Term operator/(Term a, Term b) { return a.op(Op::div, {a.v, b.v}); }
[[maybe_unused]] Term operator+(Term a, double c) { return a + a.constant(c); }
[[maybe_unused]] Term operator+(double c, Term b) { return b.constant(c) + b; }
[[maybe_unused]] Term operator-(Term a, double c) { return a - a.constant(c); }
[[maybe_unused]] Term operator-(double c, Term b) { return b.constant(c) - b; }
[[maybe_unused]] Term operator*(Term a, double c) { return a * a.constant(c); }
[[maybe_unused]] Term operator*(double c, Term b) { return b.constant(c) * b; }
[[maybe_unused]] Term operator/(Term a, double c) { return a / a.constant(c); }
[[maybe_unused]] Term operator/(double c, Term b) { return b.constant(c) / b; }
[[maybe_unused]] Term operator-(Term a) { return a.op(Op::neg, {a.v}); }
// exp(t), log(t), ...: every unary op of the registry, for derivatives that read others.
#define QKV_TERM_FUNCTION(id, ...) \
  [[maybe_unused]] Term id(Term a) { return a.op(Op::id, {a.v}); }
QKV_UNARY_OPS(QKV_TERM_FUNCTION)
#undef QKV_TERM_FUNCTION

}  // namespace

ValueId unary_derivative(Graph& g, Op op, ValueId x_id, ValueId y_id, ValueId seed_id) {
  const Term x{&g, x_id}, y{&g, y_id}, seed{&g, seed_id};
  (void)x, (void)y;  // a row's derivative may read either or neither
#define QKV_UNARY_DERIVATIVE(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, \
                             derivative, monotone)                                                                                                   \
  if (op == Op::id) return (derivative).v;
  QKV_UNARY_OPS(QKV_UNARY_DERIVATIVE)
#undef QKV_UNARY_DERIVATIVE
  QKV_UNREACHABLE(std::string(op_name(op)) + " is not a unary op");
}

namespace gradient_rules {

// One function per gradient column of ops.def that names rule(f): the gradients of n's operands
// as IR ops, each under its math comment.
using Grads = std::vector<ValueId>;

// d/dx f(x) = dy * f'(x): the registry row's derivative column
Grads unary(const GradientArgs& a) { return {unary_derivative(a.g, a.n.op, a.in[0], a.y, a.dy)}; }

// d/dx x[begin:end] = dy placed at [begin:end] in zeros of x's shape
Grads slice(const GradientArgs& a) {
  Graph& g = a.g;
  const Shape xs = a.shape(a.in[0]);
  const int ax = a.n.attrs.axis;
  Attrs join;
  join.axis = ax;
  ValueId dx = a.dy;
  if (a.n.attrs.begin > 0) {
    Shape before = xs;
    before[ax] = a.n.attrs.begin;
    dx = g.add(Op::concat, {g.add(Op::broadcast_to, {a.zero}, shape_attrs(before)), dx}, join);
  }
  if (is_symbol(xs[ax]))
    throw UnsupportedError("slice: no gradient along the named dim " + g.dim_name(xs[ax]) + " (its zero padding would be " + g.dim_name(xs[ax]) +
                           " - " + std::to_string(a.n.attrs.end) + " long)");
  if (a.n.attrs.end < xs[ax]) {
    Shape after = xs;
    after[ax] = xs[ax] - a.n.attrs.end;
    dx = g.add(Op::concat, {dx, g.add(Op::broadcast_to, {a.zero}, shape_attrs(after))}, join);
  }
  return {dx};
}

// d/da concat(a, b) = dy[:na], d/db = dy[na:] along the axis
Grads concat(const GradientArgs& a) {
  const int ax = a.n.attrs.axis;
  const Dim na = a.shape(a.in[0])[ax], total = a.n.shape[ax];
  if (is_symbol(na) || is_symbol(total))
    throw UnsupportedError("concat: no gradient along the named dim " + a.g.dim_name(is_symbol(na) ? na : total) + " (slices need static bounds)");
  Attrs first, second;
  first.axis = second.axis = ax;
  first.end = second.begin = na;
  second.end = total;
  return {a.g.add(Op::slice, {a.dy}, first), a.g.add(Op::slice, {a.dy}, second)};
}

// d/da (a + b) = dy, d/db = dy
Grads add(const GradientArgs& a) { return {a.unbroadcast(a.dy, 0), a.unbroadcast(a.dy, 1)}; }

// d/da (a - b) = dy, d/db = -dy
Grads sub(const GradientArgs& a) { return {a.unbroadcast(a.dy, 0), a.unbroadcast(a.g.add(Op::neg, {a.dy}), 1)}; }

// d/da (a * b) = dy * b, d/db = dy * a
Grads mul(const GradientArgs& a) {
  return {a.unbroadcast(a.g.add(Op::mul, {a.dy, a.in[1]}), 0), a.unbroadcast(a.g.add(Op::mul, {a.dy, a.in[0]}), 1)};
}

// d/da (a / b) = dy / b, d/db = -dy * (a / b) / b
Grads div(const GradientArgs& a) {
  Graph& g = a.g;
  return {a.unbroadcast(g.add(Op::div, {a.dy, a.in[1]}), 0),
          a.unbroadcast(g.add(Op::neg, {g.add(Op::div, {g.add(Op::mul, {a.dy, a.y}), a.in[1]})}), 1)};
}

// d/da max(a, b) = dy where a >= b, d/db = dy where b > a
Grads max(const GradientArgs& a) {
  const ValueId b_wins = a.g.add(Op::greater, {a.in[1], a.in[0]});
  return {a.unbroadcast(a.g.add(Op::where, {b_wins, a.zero, a.dy}), 0), a.unbroadcast(a.g.add(Op::where, {b_wins, a.dy, a.zero}), 1)};
}

// d/da where(c, a, b) = dy where c, d/db = dy where not c; c gets none
Grads where(const GradientArgs& a) {
  return {-1, a.unbroadcast(a.g.add(Op::where, {a.in[0], a.dy, a.zero}), 1), a.unbroadcast(a.g.add(Op::where, {a.in[0], a.zero, a.dy}), 2)};
}

// d/dx cast(x) = dy cast back to x's dtype; an i32 or bool x gets none
Grads cast(const GradientArgs& a) {
  const DType from = a.g.node(a.in[0]).dtype;
  if (!is_float(from)) return {-1};
  return {a.g.cast(a.dy, from)};
}

// d/dx sum(x) = dy broadcast over the axis
Grads reduce_sum(const GradientArgs& a) { return {expand(a.g, a.dy, a.n.attrs, a.shape(a.in[0]))}; }

// d/dx max(x) = dy at the maxima (every maximum of a tie), 0 elsewhere
Grads reduce_max(const GradientArgs& a) {
  const ValueId at_max = a.g.add(Op::equal, {a.in[0], expand(a.g, a.y, a.n.attrs, a.shape(a.in[0]))});
  return {a.g.add(Op::where, {at_max, expand(a.g, a.dy, a.n.attrs, a.shape(a.in[0])), a.zero})};
}

// C = op(A) op(B): d op(A) = dC op(B)^T, d op(B) = op(A)^T dC; transposed operands swap roles
Grads matmul(const GradientArgs& a) {
  Graph& g = a.g;
  const bool ta = a.n.attrs.transpose_a, tb = a.n.attrs.transpose_b;
  const ValueId da = ta ? g.add(Op::matmul, {a.in[1], a.dy}, matmul_attrs(tb, true)) : g.add(Op::matmul, {a.dy, a.in[1]}, matmul_attrs(false, !tb));
  const ValueId db = tb ? g.add(Op::matmul, {a.dy, a.in[0]}, matmul_attrs(true, ta)) : g.add(Op::matmul, {a.in[0], a.dy}, matmul_attrs(!ta, false));
  return {a.unbroadcast(da, 0), a.unbroadcast(db, 1)};
}

// d/dtable table[ids] = one_hot(ids)^T dy, summed over the ids' leading dims: each row the sum
// of the dy rows that picked it (ids outside the table pick none). O(ids x V x row): a matmul
// like the tied LM head's backward.
Grads embedding(const GradientArgs& a) {
  Graph& g = a.g;
  const Shape ids = a.shape(a.in[0]), table = a.shape(a.in[1]);
  if (is_symbol(table[0]))
    throw UnsupportedError("embedding: no gradient for a table of " + g.dim_name(table[0]) + " rows (one_hot needs a static depth)");
  Attrs depth;
  depth.depth = table[0];
  ValueId picks = g.add(Op::one_hot, {a.in[0]}, depth);  // [..., V]
  ValueId dy = a.dy;                                     // [..., row...]
  if (ids.rank == 0) {
    picks = g.add(Op::reshape, {picks}, shape_attrs(Shape{1, table[0]}));
    Shape flat{1};
    for (int i = 1; i < table.rank; ++i) flat.push_back(table[i]);
    dy = g.add(Op::reshape, {dy}, shape_attrs(flat));
  }
  const int lead = std::max(ids.rank, 1) - 1;  // batch dims of the matmul, summed after it
  // The rows flattened to one trailing dim, so the matmul's contraction is over the last id axis.
  Shape rows = a.shape(dy);
  Dim width = 1;
  for (int i = 1; i < table.rank; ++i) width = g.derive_dim(DimOp::product, width, table[i]);
  Shape flat;
  for (int i = 0; i <= lead; ++i) flat.push_back(rows[i]);
  flat.push_back(width);
  if (table.rank != 2) dy = g.add(Op::reshape, {dy}, shape_attrs(flat));
  if (is_half(g.node(dy).dtype)) picks = g.cast(picks, g.node(dy).dtype);
  ValueId dtable = g.add(Op::matmul, {picks, dy}, matmul_attrs(true, false));  // [lead..., V, width]
  Attrs sum;
  sum.axis = 0;
  sum.keepdim = false;
  for (int i = 0; i < lead; ++i) dtable = g.add(Op::reduce_sum, {dtable}, sum);
  if (table.rank != 2) dtable = g.add(Op::reshape, {dtable}, shape_attrs(table));
  return {-1, dtable};
}

// d/dpages page_gather(pages, table): embedding's rule, the pages [P, H, page, D] as rows of
// H page D elements picked by the table [B, n] and dy [B, H, n page, D] regrouped to those rows
// ([B, n, H page D]): each page the sum of the rows that read it. The node itself stays, for
// kernels that read the pages through the table (a decomposition would gather them first).
Grads page_gather(const GradientArgs& a) {
  Graph& g = a.g;
  const Shape pages = a.shape(a.in[0]), table = a.shape(a.in[1]);
  const Dim width = g.derive_dim(DimOp::product, g.derive_dim(DimOp::product, pages[1], pages[2]), pages[3]);
  const ValueId rows = g.add(Op::reshape, {a.in[0]}, shape_attrs(Shape{pages[0], width}));
  const ValueId split = g.add(Op::reshape, {a.dy}, shape_attrs(Shape{table[0], pages[1], table[1], pages[2], pages[3]}));
  Attrs table_first;
  table_first.perm = Perm{0, 2, 1, 3, 4};
  const ValueId grouped = g.add(Op::reshape, {g.add(Op::permute, {split}, table_first)}, shape_attrs(Shape{table[0], table[1], width}));
  const ValueId operands[] = {a.in[1], rows};
  const ValueId drows = embedding(GradientArgs{g, a.n, a.y, grouped, operands, a.zero})[1];
  return {g.add(Op::reshape, {drows}, shape_attrs(pages)), -1};
}

// d/dx permute(x, p) = permute(dy, p^-1)
Grads permute(const GradientArgs& a) {
  Attrs inverse;
  for (int i = 0; i < a.n.shape.rank; ++i)
    inverse.perm[static_cast<std::size_t>(a.n.attrs.perm[static_cast<std::size_t>(i)])] = static_cast<std::int8_t>(i);
  return {a.g.add(Op::permute, {a.dy}, inverse)};
}

// d/dx reshape(x) = reshape(dy) back to x's shape
Grads reshape(const GradientArgs& a) { return {a.g.add(Op::reshape, {a.dy}, shape_attrs(a.shape(a.in[0])))}; }

// d/dx broadcast_to(x) = dy summed over the broadcast dims
Grads broadcast_to(const GradientArgs& a) { return {a.unbroadcast(a.dy, 0)}; }

// d/dx softmax(x) = y * (dy - sum(dy * y))
Grads softmax(const GradientArgs& a) {
  Attrs keep;
  keep.axis = a.n.attrs.axis;
  const ValueId dot = a.g.add(Op::reduce_sum, {a.g.add(Op::mul, {a.dy, a.y})}, keep);
  return {a.g.add(Op::mul, {a.y, a.g.add(Op::sub, {a.dy, dot})})};
}

// d/dx sink_softmax(x, sink) = y * (dy - sum(dy * y)), as softmax's (the sink's weight is no
// output); d/dsink = -p_sink * sum(dy * y), p_sink = exp(sink - m) / z the sink's own weight
// (recomputed: 1 - sum(y) would lose it to rounding where it is small), summed to its shape.
Grads sink_softmax(const GradientArgs& a) {
  Graph& g = a.g;
  Attrs keep;
  keep.axis = a.shape(a.in[0]).rank - 1;
  const ValueId x = a.in[0], sink = a.in[1], neg_inf = g.constant(-HUGE_VAL), zero = g.constant(0.0);
  const ValueId dot = g.add(Op::reduce_sum, {g.add(Op::mul, {a.dy, a.y})}, keep);
  const ValueId dx = g.add(Op::mul, {a.y, g.add(Op::sub, {a.dy, dot})});
  ValueId m = g.add(Op::max, {g.add(Op::reduce_max, {x}, keep), sink});
  m = g.add(Op::where, {g.add(Op::equal, {m, neg_inf}), zero, m});
  const ValueId e_sink = g.add(Op::exp, {g.add(Op::sub, {sink, m})});
  ValueId z = g.add(Op::add, {g.add(Op::reduce_sum, {g.add(Op::exp, {g.add(Op::sub, {x, m})})}, keep), e_sink});
  z = g.add(Op::where, {g.add(Op::equal, {z, zero}), g.constant(1.0), z});
  const ValueId p_sink = g.add(Op::div, {e_sink, z});
  return {dx, a.unbroadcast(g.add(Op::neg, {g.add(Op::mul, {p_sink, dot})}), 1)};
}

// d/dx log_softmax(x) = dy - exp(y) * sum(dy)
Grads log_softmax(const GradientArgs& a) {
  Attrs keep;
  keep.axis = a.n.attrs.axis;
  Graph& g = a.g;
  return {g.add(Op::sub, {a.dy, g.add(Op::mul, {g.add(Op::exp, {a.y}), g.add(Op::reduce_sum, {a.dy}, keep)})})};
}

// FlashAttention-2's backward: lse = the rows' log-sum-exp, delta = sum(dy * y) over the last
// axis; attention_grad recomputes p = exp(s - lse) tile by tile, so no N x M matrix is kept.
// The mask (masked_attention's fourth operand) gets no gradient.
Grads attention(const GradientArgs& a) {
  Graph& g = a.g;
  const bool masked = a.n.op == Op::masked_attention;
  Attrs at = a.n.attrs;
  std::vector<ValueId> qk = {a.in[0], a.in[1]};
  if (masked) qk.push_back(a.in[3]);
  const ValueId lse = g.add(masked ? Op::masked_attention_lse : Op::attention_lse, qk, at);
  Attrs last;
  last.axis = a.n.shape.rank - 1;
  const ValueId delta = g.add(Op::reduce_sum, {g.add(Op::mul, {a.dy, a.y})}, last);
  // The three gradients are emitted next to each other (then unbroadcast), so that a backend
  // can compute them in one pass.
  Grads grads;
  for (int wrt = 0; wrt < 3; ++wrt) {
    std::vector<ValueId> args = {a.in[0], a.in[1], a.in[2], a.dy, lse, delta};
    if (masked) args.push_back(a.in[3]);
    at.wrt = static_cast<std::int8_t>(wrt);
    grads.push_back(g.add(masked ? Op::masked_attention_grad : Op::attention_grad, args, at));
  }
  for (int wrt = 0; wrt < 3; ++wrt) grads[static_cast<std::size_t>(wrt)] = a.unbroadcast(grads[static_cast<std::size_t>(wrt)], wrt);
  if (masked) grads.push_back(-1);
  return grads;
}

// The same for flex attention, whose grads also chain through the score modifier; each f32
// tensor the modifier reads (a bias, a position table, slopes) gets ds * d mod/d t summed over
// the dims it was broadcast along. That one is score-shaped before the sum: only a trained
// modifier tensor asks for it (the rest are dropped as dead code).
Grads flex_attention(const GradientArgs& a) {
  Graph& g = a.g;
  const Node& n = a.n;
  Attrs at = n.attrs;
  const std::span<const ValueId> tensors = a.in.subspan(3, modifier_tensor_count(n.op, n.attrs, a.in.size()));
  std::vector<ValueId> qk = {a.in[0], a.in[1]};
  qk.insert(qk.end(), tensors.begin(), tensors.end());
  const bool sink = has_sink(n.op, n.attrs);
  if (sink) qk.push_back(a.in[sink_operand(n.op, n.attrs, a.in.size())]);
  Attrs undropped = at;  // the lse is dropout's too: it normalises the weights before the mask
  undropped.dropout = 0.0;
  const ValueId lse = g.add(Op::flex_attention_lse, qk, undropped, n.region);
  at.sink = false;  // the gradients read the sink through the lse
  Attrs last;
  last.axis = n.shape.rank - 1;
  // delta = rowsum(dy * y) as without dropout: y already holds the mask's zeros and scale.
  const ValueId delta = g.add(Op::reduce_sum, {g.add(Op::mul, {a.dy, a.y})}, last);
  std::vector<ValueId> args = {a.in[0], a.in[1], a.in[2], a.dy, lse, delta};
  args.insert(args.end(), tensors.begin(), tensors.end());
  if (has_dropout_seed(n.op, n.attrs)) args.push_back(a.in.back());
  Grads grads;
  for (int wrt = 0; wrt < 3; ++wrt) {
    at.wrt = static_cast<std::int8_t>(wrt);
    grads.push_back(g.add(Op::flex_attention_grad, args, at, n.region));
  }
  for (int wrt = 0; wrt < 3; ++wrt) grads[static_cast<std::size_t>(wrt)] = a.unbroadcast(grads[static_cast<std::size_t>(wrt)], wrt);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    // Integer and boolean tensors, and those the modifier only compares, get none.
    const Graph d = differentiate_region(*n.region, kRegionFixedInputs + static_cast<int>(i));
    const Node& derivative = d.node(d.outputs()[0].second);
    if (g.node(tensors[i]).dtype != DType::f32 || (derivative.op == Op::constant && derivative.attrs.value == 0.0)) {
      grads.push_back(-1);
      continue;
    }
    at.wrt = static_cast<std::int8_t>(3 + i);
    grads.push_back(a.unbroadcast(g.add(Op::flex_attention_grad, args, at, n.region), static_cast<int>(3 + i)));
  }
  if (sink) {
    // d/dsink = sum over its rows of ds_sink = p_sink (0 - delta): the sink's weight
    // p_sink = exp(sink - lse) (0 for a sink of -inf) times no value.
    // In f32, from the sink as the lse took it (in the scores' dtype), rounded once to its own.
    const ValueId s = g.cast(g.cast(qk.back(), g.node(a.in[0]).dtype), DType::f32), neg_inf = g.constant(-HUGE_VAL);
    const ValueId e = g.add(Op::exp, {g.add(Op::sub, {s, g.cast(lse, DType::f32)})});
    const ValueId p_sink = g.add(Op::where, {g.add(Op::equal, {s, neg_inf}), g.constant(0.0), e});
    const ValueId ds = g.add(Op::neg, {g.add(Op::mul, {p_sink, g.cast(delta, DType::f32)})});
    const int at_sink = static_cast<int>(sink_operand(n.op, n.attrs, a.in.size()));
    grads.push_back(g.cast(a.unbroadcast(ds, at_sink), g.node(qk.back()).dtype));
  }
  if (has_dropout_seed(n.op, n.attrs)) grads.push_back(-1);  // the seed's bits have none
  return grads;
}

// The gradient column's three forms.
constexpr GradientInfo rule(GradientRule emit) { return {GradKind::rule, {}, emit}; }
constexpr GradientInfo zero(std::string_view why) { return {GradKind::zero, why, nullptr}; }
constexpr GradientInfo decompose(std::string_view why) { return {GradKind::decompose, why, nullptr}; }

GradientInfo of(Op op) {
  switch (op) {
#define QKV_GRADIENT_COLUMN(id, arity, category, attrs, shape_rule, gradient, ...) \
  case Op::id: return gradient;
    QKV_OPS(QKV_GRADIENT_COLUMN)
#undef QKV_GRADIENT_COLUMN
  }
  return {};
}

}  // namespace gradient_rules

GradientInfo gradient_info(Op op) { return gradient_rules::of(op); }

ValueId GradientArgs::unbroadcast(ValueId grad, int operand) const { return ir::unbroadcast(g, grad, shape(in[static_cast<std::size_t>(operand)])); }

std::vector<ValueId> emit_gradient(Graph& g, const Node& n, ValueId y, ValueId dy, std::span<const ValueId> in) {
  const GradientRule emit = gradient_info(n.op).emit;
  if (emit == nullptr) QKV_UNREACHABLE(std::string(op_name(n.op)) + " has no gradient rule to emit");
  // Zero in dy's dtype, so that the zeros a rule pads or selects with (broadcast to a shape) are
  // of the gradient's dtype: a cast for f16 and bf16 (0 is exact in each).
  const DType dt = g.node(dy).dtype;
  return emit({g, n, y, dy, in, g.cast(g.constant(0.0), is_half(dt) ? dt : DType::f32)});
}

}  // namespace qkv::ir
