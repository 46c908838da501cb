// The scalar meaning of each elementwise op, shared by the host backends' kernels: the host
// expressions of the registry's rows (ir/ops.def).
#pragma once

#include <cmath>

#include "ir/error.hpp"
#include "ir/op.hpp"

namespace qkv::backend {

/// f(x) for a unary op, from the registry row's host expression (ir/ops.def).
template <class T> constexpr T apply_unary(ir::Op op, T x) {
#define QKV_APPLY_UNARY(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, ...) \
  if (op == ir::Op::id) return host;
  QKV_UNARY_OPS(QKV_APPLY_UNARY)
#undef QKV_APPLY_UNARY
  if (op == ir::Op::cast) return x;  // host backends hold ids and booleans as numbers already
  QKV_UNREACHABLE("not a unary op");
}

/// a (op) b for a binary or comparison op, from the registry row's host expression.
template <class T> constexpr T apply_binary(ir::Op op, T a, T b) {
#define QKV_APPLY_BINARY(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, \
                         ...)                                                                                                                    \
  if (op == ir::Op::id) return host;
  QKV_BINARY_OPS(QKV_APPLY_BINARY)
  QKV_COMPARE_OPS(QKV_APPLY_BINARY)
#undef QKV_APPLY_BINARY
  QKV_UNREACHABLE("not a binary op");
}

}  // namespace qkv::backend
