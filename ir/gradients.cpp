// Gradient rules, one case per op in ops.def. Each rule is IR ops with a one-line math comment;
// `unbroadcast` undoes NumPy broadcasting of an operand.
#include "ir/gradients.hpp"

#include "ir/error.hpp"
#include "ir/region.hpp"

namespace qkv::ir {

GradientInfo gradient_info(Op op) {
  switch (op) {
    QKV_SOURCE_CASES return {GradKind::zero, "a source: gradients accumulate on it"};
    QKV_COMPARE_CASES return {GradKind::zero, "boolean output"};
    case Op::causal_mask: return {GradKind::zero, "boolean output that depends only on its operand's shape"};
    case Op::one_hot: return {GradKind::zero, "integer input"};
    case Op::cast: return {GradKind::zero, "integer or boolean input"};
    case Op::iota: return {GradKind::zero, "depends only on its operand's shape"};
    case Op::dropout_mask: return {GradKind::zero, "random bits keyed by an integer seed; its operand gives only the shape"};
    case Op::reduce_mean: return {GradKind::decompose, "sum / count: the rules of reduce_sum and div"};
    QKV_ATTENTION_BACKWARD_CASES return {GradKind::decompose, "second order, through the decomposition"};
    QKV_UNARY_CASES
    QKV_BINARY_CASES
    QKV_REDUCE_CASES
    QKV_LAYOUT_CASES
    case Op::where:
    case Op::matmul:
    case Op::softmax:
    case Op::log_softmax:
    case Op::attention:
    case Op::masked_attention:
    case Op::flex_attention: return {GradKind::rule, {}};
  }
  return {};
}

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
#define QKV_UNARY_DERIVATIVE(id, arity, category, attrs, doc, host, glsl, derivative, monotone) \
  if (op == Op::id) return (derivative).v;
  QKV_UNARY_OPS(QKV_UNARY_DERIVATIVE)
#undef QKV_UNARY_DERIVATIVE
  QKV_UNREACHABLE(std::string(op_name(op)) + " is not a unary op");
}

std::vector<ValueId> emit_gradient(Graph& g, const Node& n, ValueId y, ValueId dy, std::span<const ValueId> in) {
  // Shapes by value: adding nodes may move the graph's node storage.
  auto shape = [&](ValueId v) -> Shape { return g.node(v).shape; };
  auto unb = [&](ValueId grad, int operand) { return unbroadcast(g, grad, shape(in[static_cast<std::size_t>(operand)])); };
  const ValueId zero = g.constant(0.0);
  switch (n.op) {
    // d/dx f(x) = dy * f'(x): the registry row's derivative column
    QKV_UNARY_CASES return {unary_derivative(g, n.op, in[0], y, dy)};
    // d/dx x[begin:end] = dy placed at [begin:end] in zeros of x's shape
    case Op::slice: {
      const Shape xs = shape(in[0]);
      const int ax = n.attrs.axis;
      Attrs join;
      join.axis = ax;
      ValueId dx = dy;
      if (n.attrs.begin > 0) {
        Shape before = xs;
        before[ax] = n.attrs.begin;
        dx = g.add(Op::concat, {g.add(Op::broadcast_to, {zero}, shape_attrs(before)), dx}, join);
      }
      if (is_symbol(xs[ax]))
        throw UnsupportedError("slice: no gradient along the named dim " + g.dim_name(xs[ax]) + " (its zero padding would be " +
                               g.dim_name(xs[ax]) + " - " + std::to_string(n.attrs.end) + " long)");
      if (n.attrs.end < xs[ax]) {
        Shape after = xs;
        after[ax] = xs[ax] - n.attrs.end;
        dx = g.add(Op::concat, {dx, g.add(Op::broadcast_to, {zero}, shape_attrs(after))}, join);
      }
      return {dx};
    }
    // d/da concat(a, b) = dy[:na], d/db = dy[na:] along the axis
    case Op::concat: {
      const int ax = n.attrs.axis;
      const Dim na = shape(in[0])[ax], total = n.shape[ax];
      if (is_symbol(na) || is_symbol(total))
        throw UnsupportedError("concat: no gradient along the named dim " + g.dim_name(is_symbol(na) ? na : total) +
                               " (slices need static bounds)");
      Attrs first, second;
      first.axis = second.axis = ax;
      first.end = second.begin = na;
      second.end = total;
      return {g.add(Op::slice, {dy}, first), g.add(Op::slice, {dy}, second)};
    }
    // d/da (a + b) = dy, d/db = dy
    case Op::add: return {unb(dy, 0), unb(dy, 1)};
    // d/da (a - b) = dy, d/db = -dy
    case Op::sub: return {unb(dy, 0), unb(g.add(Op::neg, {dy}), 1)};
    // d/da (a * b) = dy * b, d/db = dy * a
    case Op::mul: return {unb(g.add(Op::mul, {dy, in[1]}), 0), unb(g.add(Op::mul, {dy, in[0]}), 1)};
    // d/da (a / b) = dy / b, d/db = -dy * (a / b) / b
    case Op::div:
      return {unb(g.add(Op::div, {dy, in[1]}), 0), unb(g.add(Op::neg, {g.add(Op::div, {g.add(Op::mul, {dy, y}), in[1]})}), 1)};
    // d/da max(a, b) = dy where a >= b, d/db = dy where b > a
    case Op::max: {
      ValueId b_wins = g.add(Op::greater, {in[1], in[0]});
      return {unb(g.add(Op::where, {b_wins, zero, dy}), 0), unb(g.add(Op::where, {b_wins, dy, zero}), 1)};
    }
    // d/da where(c, a, b) = dy where c, d/db = dy where not c; c gets none
    case Op::where: return {-1, unb(g.add(Op::where, {in[0], dy, zero}), 1), unb(g.add(Op::where, {in[0], zero, dy}), 2)};
    // d/dx sum(x) = dy broadcast over the axis
    case Op::reduce_sum: return {expand(g, dy, n.attrs, shape(in[0]))};
    // d/dx max(x) = dy at the maxima (every maximum of a tie), 0 elsewhere
    case Op::reduce_max: {
      ValueId at_max = g.add(Op::equal, {in[0], expand(g, y, n.attrs, shape(in[0]))});
      return {g.add(Op::where, {at_max, expand(g, dy, n.attrs, shape(in[0])), zero})};
    }
    // C = op(A) op(B): d op(A) = dC op(B)^T, d op(B) = op(A)^T dC; transposed operands swap roles
    case Op::matmul: {
      const bool ta = n.attrs.transpose_a, tb = n.attrs.transpose_b;
      ValueId da = ta ? g.add(Op::matmul, {in[1], dy}, matmul_attrs(tb, true)) : g.add(Op::matmul, {dy, in[1]}, matmul_attrs(false, !tb));
      ValueId db = tb ? g.add(Op::matmul, {dy, in[0]}, matmul_attrs(true, ta)) : g.add(Op::matmul, {in[0], dy}, matmul_attrs(!ta, false));
      return {unb(da, 0), unb(db, 1)};
    }
    // d/dx permute(x, p) = permute(dy, p^-1)
    case Op::permute: {
      Attrs inverse;
      for (int i = 0; i < n.shape.rank; ++i) inverse.perm[static_cast<std::size_t>(n.attrs.perm[static_cast<std::size_t>(i)])] = static_cast<std::int8_t>(i);
      return {g.add(Op::permute, {dy}, inverse)};
    }
    // d/dx reshape(x) = reshape(dy) back to x's shape
    case Op::reshape: {
      Attrs back;
      back.shape = shape(in[0]);
      return {g.add(Op::reshape, {dy}, back)};
    }
    // d/dx broadcast_to(x) = dy summed over the broadcast dims
    case Op::broadcast_to: return {unb(dy, 0)};
    // d/dx softmax(x) = y * (dy - sum(dy * y))
    case Op::softmax: {
      Attrs keep;
      keep.axis = n.attrs.axis;
      ValueId dot = g.add(Op::reduce_sum, {g.add(Op::mul, {dy, y})}, keep);
      return {g.add(Op::mul, {y, g.add(Op::sub, {dy, dot})})};
    }
    // d/dx log_softmax(x) = dy - exp(y) * sum(dy)
    case Op::log_softmax: {
      Attrs keep;
      keep.axis = n.attrs.axis;
      return {g.add(Op::sub, {dy, g.add(Op::mul, {g.add(Op::exp, {y}), g.add(Op::reduce_sum, {dy}, keep)})})};
    }
    QKV_SOURCE_CASES
    QKV_COMPARE_CASES
    QKV_MASK_CASES
    case Op::cast:
    // FlashAttention-2's backward: lse = the rows' log-sum-exp, delta = sum(dy * y) over the last
    // axis; attention_grad recomputes p = exp(s - lse) tile by tile, so no N x M matrix is kept.
    // The mask gets no gradient.
    case Op::attention:
    case Op::masked_attention: {
      const bool masked = n.op == Op::masked_attention;
      Attrs a = n.attrs;
      std::vector<ValueId> qk = {in[0], in[1]};
      if (masked) qk.push_back(in[3]);
      ValueId lse = g.add(masked ? Op::masked_attention_lse : Op::attention_lse, qk, a);
      Attrs last;
      last.axis = n.shape.rank - 1;
      ValueId delta = g.add(Op::reduce_sum, {g.add(Op::mul, {dy, y})}, last);
      // The three gradients are emitted next to each other (then unbroadcast), so that a backend
      // can compute them in one pass.
      std::vector<ValueId> grads;
      for (int wrt = 0; wrt < 3; ++wrt) {
        std::vector<ValueId> args = {in[0], in[1], in[2], dy, lse, delta};
        if (masked) args.push_back(in[3]);
        a.wrt = static_cast<std::int8_t>(wrt);
        grads.push_back(g.add(masked ? Op::masked_attention_grad : Op::attention_grad, args, a));
      }
      for (int wrt = 0; wrt < 3; ++wrt) grads[static_cast<std::size_t>(wrt)] = unb(grads[static_cast<std::size_t>(wrt)], wrt);
      if (masked) grads.push_back(-1);
      return grads;
    }
    // The same for flex attention, whose grads also chain through the score modifier; each f32
    // tensor the modifier reads (a bias, a position table, slopes) gets ds * d mod/d t summed
    // over the dims it was broadcast along. That one is score-shaped before the sum: only a
    // trained modifier tensor asks for it (the rest are dropped as dead code).
    case Op::flex_attention: {
      Attrs a = n.attrs;
      const std::span<const ValueId> tensors = in.subspan(3, modifier_tensor_count(n.op, n.attrs, in.size()));
      std::vector<ValueId> qk = {in[0], in[1]};
      qk.insert(qk.end(), tensors.begin(), tensors.end());
      Attrs undropped = a;  // the lse is dropout's too: it normalises the weights before the mask
      undropped.dropout = 0.0;
      ValueId lse = g.add(Op::flex_attention_lse, qk, undropped, n.region);
      Attrs last;
      last.axis = n.shape.rank - 1;
      ValueId delta = g.add(Op::reduce_sum, {g.add(Op::mul, {dy, y})}, last);
      // delta = rowsum(dy * y) as without dropout: y already holds the mask's zeros and scale.
      std::vector<ValueId> args = {in[0], in[1], in[2], dy, lse, delta};
      args.insert(args.end(), tensors.begin(), tensors.end());
      if (has_dropout_seed(n.op, n.attrs)) args.push_back(in.back());
      std::vector<ValueId> grads;
      for (int wrt = 0; wrt < 3; ++wrt) {
        a.wrt = static_cast<std::int8_t>(wrt);
        grads.push_back(g.add(Op::flex_attention_grad, args, a, n.region));
      }
      for (int wrt = 0; wrt < 3; ++wrt) grads[static_cast<std::size_t>(wrt)] = unb(grads[static_cast<std::size_t>(wrt)], wrt);
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        // Integer and boolean tensors, and those the modifier only compares, get none.
        const Graph d = differentiate_region(*n.region, kRegionFixedInputs + static_cast<int>(i));
        const Node& derivative = d.node(d.outputs()[0].second);
        if (g.node(tensors[i]).dtype != DType::f32 || (derivative.op == Op::constant && derivative.attrs.value == 0.0)) {
          grads.push_back(-1);
          continue;
        }
        a.wrt = static_cast<std::int8_t>(3 + i);
        grads.push_back(unb(g.add(Op::flex_attention_grad, args, a, n.region), static_cast<int>(3 + i)));
      }
      if (has_dropout_seed(n.op, n.attrs)) grads.push_back(-1);  // the seed's bits have none
      return grads;
    }
    QKV_ATTENTION_BACKWARD_CASES
    case Op::reduce_mean: break;
  }
  QKV_UNREACHABLE(std::string(op_name(n.op)) + " has no gradient rule to emit");
}

}  // namespace qkv::ir
