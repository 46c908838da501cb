// Ops, their attributes and their registry entries, generated from ops.def.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>

#include "ir/dtype.hpp"
#include "ir/shape.hpp"

namespace qkv::ir {

#include "ir/ops.def"

enum class Op : std::uint8_t {
#define QKV_OP_ENUMERATOR(id, arity, category, attrs, doc, ...) id,
  QKV_OPS(QKV_OP_ENUMERATOR)
#undef QKV_OP_ENUMERATOR
};

#define QKV_OP_ONE(id, arity, category, attrs, doc, ...) +1
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
#define QKV_OP_CASE(id, arity, category, attrs, doc, ...) case ::qkv::ir::Op::id:
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
#define QKV_ATTENTION_BACKWARD_CASES                                                          \
  case ::qkv::ir::Op::attention_lse:                                                          \
  case ::qkv::ir::Op::masked_attention_lse:                                                   \
  case ::qkv::ir::Op::flex_attention_lse:                                                     \
  case ::qkv::ir::Op::attention_grad:                                                         \
  case ::qkv::ir::Op::masked_attention_grad:                                                  \
  case ::qkv::ir::Op::flex_attention_grad:
/// Every op that is not a composite (the primitives backends must run).
#define QKV_PRIMITIVE_CASES                                                                                   \
  QKV_SOURCE_CASES QKV_UNARY_CASES QKV_CAST_CASES QKV_BINARY_CASES QKV_SELECT_CASES QKV_COMPARE_CASES \
  QKV_REDUCE_CASES QKV_CONTRACT_CASES QKV_LAYOUT_CASES QKV_MASK_CASES

enum class OpCategory : std::uint8_t {
  source, unary, binary, select, compare, reduce, contract, layout, mask, composite
};

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
};

enum class CausalAlign : std::uint8_t { top_left, bottom_right };

/// Attributes of a node. One flat literal struct: each op reads the fields its registry entry
/// names; the others keep their defaults so that equal nodes compare equal.
struct Attrs {
  int axis = 0;
  bool keepdim = true;
  bool transpose_a = false;
  bool transpose_b = false;
  CausalAlign align = CausalAlign::top_left;
  bool causal = false;
  std::int64_t depth = 0;
  std::int64_t begin = 0;   // slice
  std::int64_t end = 0;     // slice
  std::int64_t window = 0;  // causal masks: keep only the last `window` keys (0: all)
  std::int8_t wrt = 0;      // attention_grad: the operand differentiated (0 q, 1 k, 2 v)
  double dropout = 0.0;     // flex attention: dropout probability on the weights (0: none; see dropout_seed_operands)
  std::array<std::int8_t, kMaxRank> perm{};
  Shape shape{};
  DType dtype = DType::f32;
  double value = 0.0;
  /// With kAttrValue: a dim (0: none) whose size scales the value by 1/sqrt(size) when the graph
  /// is bound, so a default attention scale 1/sqrt(D) means the same at every D.
  Dim rsqrt_of = 0;

  friend constexpr bool operator==(const Attrs& a, const Attrs& b) {
    return a.axis == b.axis && a.keepdim == b.keepdim && a.transpose_a == b.transpose_a &&
           a.transpose_b == b.transpose_b && a.align == b.align && a.causal == b.causal && a.depth == b.depth && a.begin == b.begin && a.end == b.end &&
           a.window == b.window && a.wrt == b.wrt && a.dropout == b.dropout && a.perm == b.perm &&
           a.shape == b.shape && a.dtype == b.dtype && a.rsqrt_of == b.rsqrt_of &&
           (a.value == b.value || (a.value != a.value && b.value != b.value));
  }
};

/// Attributes carrying only a shape (reshape, broadcast_to, constant).
constexpr Attrs shape_attrs(const Shape& s) {
  Attrs a;
  a.shape = s;
  return a;
}

struct OpInfo {
  std::string_view name;
  int arity;
  OpCategory category;
  std::uint32_t attrs;
  std::string_view doc;
};

#define QKV_OP_INFO(id, arity, category, attrs, doc, ...) {#id, arity, OpCategory::category, attrs, doc},
inline constexpr std::array<OpInfo, kNumOps> kOpInfos = {{QKV_OPS(QKV_OP_INFO)}};
#undef QKV_OP_INFO

constexpr const OpInfo& op_info(Op op) { return kOpInfos[static_cast<std::size_t>(op)]; }
constexpr std::string_view op_name(Op op) { return op_info(op).name; }
constexpr bool is_elementwise(Op op) {
  auto c = op_info(op).category;
  return c == OpCategory::unary || c == OpCategory::binary || c == OpCategory::select;
}

/// The Monotone column of a unary op's row.
constexpr Monotone unary_monotone(Op op) {
#define QKV_UNARY_MONOTONE(id, arity, category, attrs, doc, host, glsl, derivative, monotone) \
  if (op == Op::id) return Monotone::monotone;
  QKV_UNARY_OPS(QKV_UNARY_MONOTONE)
#undef QKV_UNARY_MONOTONE
  return Monotone::periodic;  // not a unary op: callers ask only for unary ops
}

/// Fused attention and the ops of its fused backward: the ops a backend with a flash-attention
/// kernel keeps instead of decomposing.
constexpr bool is_fused_attention(Op op) {
  switch (op) {
    QKV_ATTENTION_CASES return true;
    QKV_PRIMITIVE_CASES
    QKV_COMPOSITE_CASES return false;
  }
  return false;
}

/// The flex attention ops: their score modifier is the node's region, their operands after
/// fixed_operands(op) are the tensors it reads.
constexpr bool is_flex_attention(Op op) {
  return op == Op::flex_attention || op == Op::flex_attention_lse || op == Op::flex_attention_grad;
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

/// Whether a flex node with these attributes drops weights: flex_attention and its gradient
/// then take the dropout seed (an i32 scalar) as their last operand, after the modifier's tensors.
constexpr bool has_dropout_seed(Op op, const Attrs& a) {
  return (op == Op::flex_attention || op == Op::flex_attention_grad) && a.dropout != 0.0;
}

/// The number of tensors a flex node's modifier reads, operands fixed_operands(op) on, of
/// `operands` in all (0 when there are too few for the op to be valid).
constexpr std::size_t modifier_tensor_count(Op op, const Attrs& a, std::size_t operands) {
  const std::size_t others = fixed_operands(op) + (has_dropout_seed(op, a) ? 1 : 0);
  return operands > others ? operands - others : 0;
}

/// All ops, in registry order.
constexpr std::array<Op, kNumOps> all_ops() {
  std::array<Op, kNumOps> ops{};
  for (int i = 0; i < kNumOps; ++i) ops[static_cast<std::size_t>(i)] = static_cast<Op>(i);
  return ops;
}

}  // namespace qkv::ir
