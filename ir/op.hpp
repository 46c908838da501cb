// Ops, their attributes and their registry entries, generated from ops.def.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "ir/dtype.hpp"
#include "ir/error.hpp"
#include "ir/half.hpp"  // round_to: the host function of round_f16 and round_bf16
#include "ir/shape.hpp"

namespace qkv::ir {

#include "ir/ops.def"

/// Every op of the registry (ir/ops.def), in its order: `qkv ops` lists them with their docs.
enum class Op : std::uint8_t {
#define QKV_OP_ENUMERATOR(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, ...) id,
  QKV_OPS(QKV_OP_ENUMERATOR)
#undef QKV_OP_ENUMERATOR
};

#define QKV_OP_ONE(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, ...) +1
/// The number of ops in the registry.
inline constexpr int kNumOps = 0 QKV_OPS(QKV_OP_ONE);
#undef QKV_OP_ONE

/// `case Op::a: case Op::b: ...` for every op of one list of ops.def, so a switch treats a list
/// alike without naming its ops again (and stays exhaustive, without `default:`):
/// \code
///   switch (op) {
///     QKV_UNARY_CASES return elementwise(...);
///     case Op::matmul: ...
///   }
/// \endcode
#define QKV_OP_CASE(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, ...) \
  case ::qkv::ir::Op::id:
#define QKV_SOURCE_CASES QKV_SOURCE_OPS(QKV_OP_CASE)
#define QKV_UNARY_CASES QKV_UNARY_OPS(QKV_OP_CASE)
#define QKV_CAST_CASES QKV_CAST_OPS(QKV_OP_CASE)
#define QKV_BINARY_CASES QKV_BINARY_OPS(QKV_OP_CASE)
#define QKV_SELECT_CASES QKV_SELECT_OPS(QKV_OP_CASE)
#define QKV_COMPARE_CASES QKV_COMPARE_OPS(QKV_OP_CASE)
#define QKV_REDUCE_CASES QKV_REDUCE_OPS(QKV_OP_CASE)
#define QKV_CONTRACT_CASES QKV_CONTRACT_OPS(QKV_OP_CASE)
#define QKV_LAYOUT_CASES QKV_LAYOUT_OPS(QKV_OP_CASE)
#define QKV_MASK_CASES QKV_MASK_OPS(QKV_OP_CASE)
#define QKV_COMPOSITE_CASES QKV_COMPOSITE_OPS(QKV_OP_CASE)
#define QKV_ATTENTION_CASES QKV_ATTENTION_OPS(QKV_OP_CASE)
/// The fused attention backward's ops: the row statistic the forward normalised by, and the
/// gradients (FlashAttention-2).
#define QKV_ATTENTION_BACKWARD_CASES         \
  case ::qkv::ir::Op::attention_lse:         \
  case ::qkv::ir::Op::masked_attention_lse:  \
  case ::qkv::ir::Op::flex_attention_lse:    \
  case ::qkv::ir::Op::attention_grad:        \
  case ::qkv::ir::Op::masked_attention_grad: \
  case ::qkv::ir::Op::flex_attention_grad:
/// Attention's tangent ops (forward mode).
#define QKV_ATTENTION_JVP_CASES             \
  case ::qkv::ir::Op::attention_jvp:        \
  case ::qkv::ir::Op::masked_attention_jvp: \
  case ::qkv::ir::Op::flex_attention_jvp:
/// Every op that is not a composite (the primitives backends must run).
#define QKV_PRIMITIVE_CASES                                                                                                               \
  QKV_SOURCE_CASES QKV_UNARY_CASES QKV_CAST_CASES QKV_BINARY_CASES QKV_SELECT_CASES QKV_COMPARE_CASES QKV_REDUCE_CASES QKV_CONTRACT_CASES \
      QKV_LAYOUT_CASES QKV_MASK_CASES

/// An op's kind, its registry list: which rules, kernels and cases it shares with the others of its list.
enum class OpCategory : std::uint8_t { source, unary, binary, select, compare, reduce, contract, layout, mask, composite };

/// How a unary op maps an interval, the registry's last column for unary ops: interval
/// arithmetic over score modifiers (ir/region.cpp, codegen's GLSL) bounds f([lo, hi]) with it.
enum class Monotone : std::uint8_t {
  increasing,            // f([lo, hi]) = [f(lo), f(hi)]
  increasing_from_zero,  // increasing on [0, inf]; NaN below 0 (log, sqrt)
  decreasing,            // f([lo, hi]) = [f(hi), f(lo)]
  periodic,              // within [-1, 1]; NaN at the infinities (sin, cos)
};

/// Which attribute fields an op reads (and prints).
enum AttrFlag : std::uint32_t {
  kAttrAxis = 1u << 0,
  kAttrKeepdim = 1u << 1,
  kAttrTranspose = 1u << 2,
  kAttrPerm = 1u << 3,
  kAttrShape = 1u << 4,
  kAttrValue = 1u << 5,
  kAttrDtype = 1u << 6,
  kAttrAlign = 1u << 7,
  kAttrCausal = 1u << 8,
  kAttrDepth = 1u << 9,
  kAttrRange = 1u << 10,
  kAttrWindow = 1u << 11,
  kAttrWrt = 1u << 12,
  kAttrDropout = 1u << 13,
  kAttrScale = 1u << 14,
  kAttrSink = 1u << 15,
};

/// Where a causal mask's diagonal starts when there are more keys than queries: key j is kept for
/// query i when j <= i (top_left) or j <= i + keys - queries (bottom_right).
enum class CausalAlign : std::uint8_t { top_left, bottom_right };

/// A permutation: out dim i is input dim perm[i].
using Perm = std::array<std::int8_t, kMaxRank>;

/// When an attribute is printed (and so parsed back): always when its op reads it, only when it
/// differs from its default, or never (the node's type says it).
enum class AttrPrint : std::uint8_t { always, when_set, never };

/// Every attribute, once: X(field, type, default, flag, print, kind). The list generates the
/// field of Attrs, equality, hashing (graph.cpp), printing and parsing (printer.cpp: text_<kind>
/// and parse_<kind>), in this order (the order attributes print in); `flag` is the AttrFlag an
/// op's row names to read the field.
#define QKV_ATTRS(X)                                                                                                          \
  X(axis, int, 0, kAttrAxis, always, axis)                                                                                    \
  X(keepdim, bool, true, kAttrKeepdim, always, boolean)                                                                       \
  X(transpose_a, bool, false, kAttrTranspose, always, boolean)                                                                \
  X(transpose_b, bool, false, kAttrTranspose, always, boolean)                                                                \
  X(perm, Perm, {}, kAttrPerm, always, perm)     /* printed over the result's rank */                                         \
  X(shape, Shape, {}, kAttrShape, always, shape) /* an input's is its type */                                                 \
  X(value, double, 0.0, kAttrValue, always, number)                                                                           \
  X(scale, double, 0.0, kAttrScale, always, number)                                                                           \
  X(rsqrt_of, Dim, 0, (kAttrValue | kAttrScale), when_set, dim) /* value or scale / sqrt(this dim's size) (0: none) */        \
  X(depth, std::int64_t, 0, kAttrDepth, always, size)                                                                         \
  X(begin, std::int64_t, 0, kAttrRange, always, size)                                                                         \
  X(end, std::int64_t, 0, kAttrRange, always, size)                                                                           \
  X(causal, bool, false, kAttrCausal, always, boolean)                                                                        \
  X(align, CausalAlign, CausalAlign::top_left, kAttrAlign, always, align)                                                     \
  X(window, std::int64_t, 0, kAttrWindow, when_set, size)      /* keep only the last `window` keys (0: all) */                \
  X(wrt, std::int8_t, 0, kAttrWrt, always, operand)            /* attention_grad: the operand (0 q, 1 k, 2 v, 3 + i: ti) */   \
  X(dropout, double, 0.0, kAttrDropout, when_set, number)      /* flex attention, dropout_mask: drop probability (0: none) */ \
  X(sink, bool, false, kAttrSink, when_set, boolean)           /* flex attention: a sink logit per row is an operand */       \
  X(dtype, DType, DType::f32, kAttrDtype, never, result_dtype) /* input and cast: their result's dtype */

/// An attribute's values compare equal; doubles also when both are NaN (a NaN constant is one node).
template <class T> constexpr bool attr_equal(const T& a, const T& b) { return a == b; }
/// Doubles compare equal also when both are NaN.
constexpr bool attr_equal(double a, double b) { return a == b || (a != a && b != b); }

/// Attributes of a node. One flat literal struct: each op reads the fields its registry entry
/// names; the others keep their defaults so that equal nodes compare equal.
struct Attrs {
#define QKV_ATTR_FIELD(field, type, init, flag, print, kind) type field = init;
  QKV_ATTRS(QKV_ATTR_FIELD)
#undef QKV_ATTR_FIELD

  /// Every field equal (attr_equal): equal nodes are shared.
  friend constexpr bool operator==(const Attrs& a, const Attrs& b) {
#define QKV_ATTR_EQUAL(field, type, init, flag, print, kind) &&attr_equal(a.field, b.field)
    return true QKV_ATTRS(QKV_ATTR_EQUAL);
#undef QKV_ATTR_EQUAL
  }
};
/// \var Attrs::axis
/// The axis a reduction, softmax, concat, slice, iota or cache_write works along.
/// \var Attrs::keepdim
/// Reductions: whether the reduced axis stays, of size 1.
/// \var Attrs::transpose_a
/// matmul: whether the first operand's last two dims are swapped.
/// \var Attrs::transpose_b
/// matmul: whether the second operand's last two dims are swapped.
/// \var Attrs::perm
/// permute: output dim i is input dim perm[i] (printed over the result's rank).
/// \var Attrs::shape
/// The result's shape for reshape, broadcast_to and constant (an input's is its type).
/// \var Attrs::value
/// A constant's value.
/// \var Attrs::scale
/// Attention ops: the factor of the scores q kT (1/sqrt(head dim) by default, through rsqrt_of).
/// \var Attrs::rsqrt_of
/// A constant's value or an attention op's scale is divided by the square root of this dim's
/// size once bound (0: none).
/// \var Attrs::depth
/// one_hot: the number of classes.
/// \var Attrs::begin
/// slice: the first index kept.
/// \var Attrs::end
/// slice: one past the last index kept.
/// \var Attrs::causal
/// Attention ops: whether future keys are masked.
/// \var Attrs::align
/// Causal masks: where the diagonal starts.
/// \var Attrs::window
/// Attention ops and causal_mask: keep only the last `window` keys (0: all).
/// \var Attrs::wrt
/// Attention gradients: the operand differentiated (0 q, 1 k, 2 v, 3 + i: the modifier's tensor i).
/// \var Attrs::dropout
/// Flex attention and dropout_mask: the probability that a weight is dropped (0: none).
/// \var Attrs::sink
/// flex_attention and flex_attention_lse: whether each row's softmax has a sink, a logit with no
/// value (sink_softmax), given as the operand after the modifier's tensors.
/// \var Attrs::dtype
/// input and cast: their result's dtype.

/// Attributes carrying only a shape (reshape, broadcast_to, constant).
constexpr Attrs shape_attrs(const Shape& s) {
  Attrs a;
  a.shape = s;
  return a;
}

/// What mixed precision (the autocast pass) does to an op's float operands: the registry's
/// autocast column, PyTorch's CUDA autocast lists for qkv's ops.
enum class Autocast : std::uint8_t {
  lower,    ///< matmul and attention: float operands (attention's q, k, v) cast to the lower dtype
  f32,      ///< exponentials, logarithms, softmaxes and sums: half operands cast to f32
  promote,  ///< operands of mixed float dtypes all cast to the widest (torch's promotion)
  keep,     ///< sources and casts: as they are
};

/// Which operand of an attention op is which: the registry's roles column (-1: the op has no
/// such operand). A flex op's modifier tensors follow its fixed operands (fixed_operands), and
/// its dropout seed, when it drops, is its last operand.
struct AttentionRoles {
  std::int8_t q = -1;        ///< the queries [..,N,D]
  std::int8_t k = -1;        ///< the keys [..,M,D]
  std::int8_t v = -1;        ///< the values [..,M,Dv]
  std::int8_t mask = -1;     ///< the boolean keep-mask of the masked_ ops
  std::int8_t dy = -1;       ///< the backward's output gradient
  std::int8_t lse = -1;      ///< the backward's row statistic log(sum(exp(s)))
  std::int8_t delta = -1;    ///< the backward's sum(dy * y) per row
  std::int8_t tangent = -1;  ///< forward mode's tangent of q; those of k and v follow it
  /// Whether the op is of the attention family at all.
  constexpr bool attention() const { return q >= 0; }
  /// Whether the op is attention's forward (reads q, k and v, gives the output).
  constexpr bool forward() const { return v >= 0 && dy < 0 && tangent < 0; }
  /// Whether the op is attention's tangent (forward mode: reads q, k, v and their tangents).
  constexpr bool jvp() const { return tangent >= 0; }
  /// Whether the op is attention's gradient (reads dy).
  constexpr bool backward() const { return dy >= 0; }
  /// Whether operand `i` is one of the streamed tensors, q, k, v, dy or the tangents (not the
  /// mask, lse, delta, a modifier's tensor or the seed).
  constexpr bool streamed(std::size_t i) const {
    for (int r : {q, k, v, dy})
      if (r >= 0 && static_cast<std::size_t>(r) == i) return true;
    return tangent >= 0 && i >= static_cast<std::size_t>(tangent) && i < static_cast<std::size_t>(tangent) + 3;
  }
};

/// The values of the roles column.
namespace operand_roles {
/// Not an attention op.
inline constexpr AttentionRoles none{};
/// attention, flex_attention: (q, k, v, ...).
inline constexpr AttentionRoles qkv{0, 1, 2};
/// masked_attention: (q, k, v, mask).
inline constexpr AttentionRoles qkv_mask{0, 1, 2, 3};
/// attention_lse, flex_attention_lse: (q, k, ...).
inline constexpr AttentionRoles qk{0, 1};
/// masked_attention_lse: (q, k, mask).
inline constexpr AttentionRoles qk_mask{0, 1, -1, 2};
/// attention_grad, flex_attention_grad: (q, k, v, dy, lse, delta, ...).
inline constexpr AttentionRoles grad{0, 1, 2, -1, 3, 4, 5};
/// masked_attention_grad: (q, k, v, dy, lse, delta, mask).
inline constexpr AttentionRoles grad_mask{0, 1, 2, 6, 3, 4, 5};
/// attention_jvp, flex_attention_jvp: (q, k, v, tq, tk, tv, ...).
inline constexpr AttentionRoles jvp{0, 1, 2, -1, -1, -1, -1, 3};
/// masked_attention_jvp: (q, k, v, tq, tk, tv, mask).
inline constexpr AttentionRoles jvp_mask{0, 1, 2, 6, -1, -1, -1, 3};
}  // namespace operand_roles

/// What the registry says of an op, for printing, parsing and checking nodes.
struct OpInfo {
  std::string_view name;  ///< as printed and parsed ("matmul")
  int arity;              ///< operands it takes; -n: n or more (the variadic flex attention ops)
  OpCategory category;    ///< its list in ops.def
  std::uint32_t attrs;    ///< the AttrFlag bits of the attributes it reads
  Autocast autocast;      ///< what mixed precision does to its operands
  AttentionRoles roles;   ///< which operand is q, k, v, ... (attention ops)
  std::string_view doc;   ///< its meaning, as `qkv ops` prints it
};

#define QKV_OP_INFO(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, ...) \
  {#id, arity, OpCategory::category, attrs, Autocast::autocast, operand_roles::roles, doc},
/// Every op's OpInfo, indexed by the Op's value.
inline constexpr std::array<OpInfo, kNumOps> kOpInfos = {{QKV_OPS(QKV_OP_INFO)}};
#undef QKV_OP_INFO

/// The registry's entry of `op`.
constexpr const OpInfo& op_info(Op op) { return kOpInfos[static_cast<std::size_t>(op)]; }
/// The op's name as the IR text writes it.
constexpr std::string_view op_name(Op op) { return op_info(op).name; }
/// Which operand of an attention op is q, k, v, the mask, dy, lse and delta (the roles column).
constexpr const AttentionRoles& attention_roles(Op op) { return op_info(op).roles; }
/// Whether the op computes each element from the same position of its operands (unary, binary
/// and select ops).
constexpr bool is_elementwise(Op op) {
  auto c = op_info(op).category;
  return c == OpCategory::unary || c == OpCategory::binary || c == OpCategory::select;
}

/// The Monotone column of a unary op's row.
constexpr Monotone unary_monotone(Op op) {
#define QKV_UNARY_MONOTONE(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, \
                           derivative, monotone)                                                                                                   \
  if (op == Op::id) return Monotone::monotone;
  QKV_UNARY_OPS(QKV_UNARY_MONOTONE)
#undef QKV_UNARY_MONOTONE
  QKV_UNREACHABLE("unary_monotone of an op that is not unary");
}

/// Fused attention and the ops of its fused backward: the ops a backend with a flash-attention
/// kernel keeps instead of decomposing.
constexpr bool is_fused_attention(Op op) {
  // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
  // clang-format off
  switch (op) {
    QKV_ATTENTION_CASES return true;
    QKV_PRIMITIVE_CASES
    QKV_COMPOSITE_CASES return false;
  }
  // clang-format on
  return false;
}

/// The flex attention ops: their score modifier is the node's region, their operands after
/// fixed_operands(op) are the tensors it reads.
constexpr bool is_flex_attention(Op op) {
  return op == Op::flex_attention || op == Op::flex_attention_lse || op == Op::flex_attention_grad || op == Op::flex_attention_jvp;
}

/// The tangent op (forward mode) of forward attention op `op`: attention_jvp, masked_attention_jvp
/// or flex_attention_jvp (operands q, k, v, their tangents, then the forward's others).
constexpr Op tangent_op(Op op) {
  // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
  // clang-format off
  switch (op) {
    case Op::attention: return Op::attention_jvp;
    case Op::masked_attention: return Op::masked_attention_jvp;
    case Op::flex_attention: return Op::flex_attention_jvp;
    QKV_PRIMITIVE_CASES
    QKV_COMPOSITE_CASES
    QKV_ATTENTION_BACKWARD_CASES
    QKV_ATTENTION_JVP_CASES break;
  }
  // clang-format on
  QKV_UNREACHABLE(std::string(op_name(op)) + " is not forward attention");
}

/// Whether `op` takes `n` operands: its arity, or at least -arity for a variadic op.
constexpr bool arity_accepts(Op op, std::size_t n) {
  const int a = op_info(op).arity;
  return a >= 0 ? n == static_cast<std::size_t>(a) : n >= static_cast<std::size_t>(-a);
}

/// The fixed operands of a variadic op (its arity's magnitude), before the modifier's tensors.
constexpr std::size_t fixed_operands(Op op) {
  const int a = op_info(op).arity;
  return static_cast<std::size_t>(a < 0 ? -a : a);
}

/// Whether a flex node with these attributes drops weights: flex_attention, its gradient and its
/// tangent then take the dropout seed (an i32 scalar) as their last operand, after the modifier's
/// tensors.
constexpr bool has_dropout_seed(Op op, const Attrs& a) {
  return (op == Op::flex_attention || op == Op::flex_attention_grad || op == Op::flex_attention_jvp) && a.dropout != 0.0;
}

/// Whether a flex node with these attributes has attention sinks: flex_attention, its lse and its
/// tangent then take the sink logits (broadcasting to the lse's [..,N,1]) after the modifier's
/// tensors, before a dropout seed. The gradient ops need none: the lse they read includes the sink.
constexpr bool has_sink(Op op, const Attrs& a) {
  return (op == Op::flex_attention || op == Op::flex_attention_lse || op == Op::flex_attention_jvp) && a.sink;
}

/// The number of tensors a flex node's modifier reads, operands fixed_operands(op) on, of
/// `operands` in all (0 when there are too few for the op to be valid).
constexpr std::size_t modifier_tensor_count(Op op, const Attrs& a, std::size_t operands) {
  const std::size_t others = fixed_operands(op) + (has_dropout_seed(op, a) ? 1 : 0) + (has_sink(op, a) ? 1 : 0);
  return operands > others ? operands - others : 0;
}

/// A flex node's sink operand (has_sink): after the modifier's tensors, before the seed.
constexpr std::size_t sink_operand(Op op, const Attrs& a, std::size_t operands) { return operands - 1 - (has_dropout_seed(op, a) ? 1 : 0); }

/// All ops, in registry order.
constexpr std::array<Op, kNumOps> all_ops() {
  std::array<Op, kNumOps> ops{};
  for (int i = 0; i < kNumOps; ++i) ops[static_cast<std::size_t>(i)] = static_cast<Op>(i);
  return ops;
}

}  // namespace qkv::ir
