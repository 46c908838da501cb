// The scalar meaning of each elementwise op, shared by the host backends' kernels.
#pragma once

#include <cmath>

#include "ir/error.hpp"
#include "ir/op.hpp"

namespace qkv::backend {

template <class T>
constexpr T apply_unary(ir::Op op, T x) {
  switch (op) {
    case ir::Op::neg: return -x;
    case ir::Op::exp: return std::exp(x);
    case ir::Op::log: return std::log(x);
    case ir::Op::sqrt: return std::sqrt(x);
    case ir::Op::tanh: return std::tanh(x);
    case ir::Op::erf: return std::erf(x);
    case ir::Op::sin: return std::sin(x);
    case ir::Op::cos: return std::cos(x);
    case ir::Op::cast: return x;  // host backends hold ids and booleans as numbers already
    default: QKV_UNREACHABLE("not a unary op");
  }
}

template <class T>
constexpr T apply_binary(ir::Op op, T a, T b) {
  switch (op) {
    case ir::Op::add: return a + b;
    case ir::Op::sub: return a - b;
    case ir::Op::mul: return a * b;
    case ir::Op::div: return a / b;
    case ir::Op::max: return a > b || std::isnan(a) ? a : b;
    case ir::Op::equal: return a == b ? T(1) : T(0);
    case ir::Op::greater: return a > b ? T(1) : T(0);
    default: QKV_UNREACHABLE("not a binary op");
  }
}

}  // namespace qkv::backend
