// CPU kernels: contiguous inner loops the compiler vectorises, sgemm for matmul.
#include "backends/cpu/kernels.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/scalar_ops.hpp"

namespace qkv::backend::cpu {

namespace {

/// The shape without its last dim (the rows an inner loop runs over).
ir::Shape leading(const ir::Shape& s) {
  ir::Shape r;
  for (int i = 0; i + 1 < s.rank; ++i) r.push_back(s[i]);
  return r;
}

template <ir::Op O>
void binary_rows(const float* a, const float* b, float* out, std::int64_t n, std::int64_t sa, std::int64_t sb) {
  if (sa == 1 && sb == 1) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = apply_binary(O, a[i], b[i]);
  } else if (sa == 1) {
    const float y = b[0];
    for (std::int64_t i = 0; i < n; ++i) out[i] = apply_binary(O, a[i], y);
  } else if (sb == 1) {
    const float x = a[0];
    for (std::int64_t i = 0; i < n; ++i) out[i] = apply_binary(O, x, b[i]);
  } else {
    const float v = apply_binary(O, a[0], b[0]);
    for (std::int64_t i = 0; i < n; ++i) out[i] = v;
  }
}

template <ir::Op O>
void binary_impl(ConstView a, ConstView b, View out) {
  const ir::Shape& os = out.shape;
  std::int64_t inner = os.rank ? os.back() : 1;
  Strides sa = broadcast_strides(a.shape, os), sb = broadcast_strides(b.shape, os);
  std::int64_t ia = os.rank ? sa[static_cast<std::size_t>(os.rank - 1)] : 0;
  std::int64_t ib = os.rank ? sb[static_cast<std::size_t>(os.rank - 1)] : 0;
  ir::Shape rows = leading(os);
  std::int64_t nrows = rows.numel();
  OffsetWalker<2> w{rows, {sa, sb}};
  for (std::int64_t r = 0; r < nrows; ++r, w.next())
    binary_rows<O>(a.data + w.offset[0], b.data + w.offset[1], out.data + r * inner, inner, ia, ib);
}

}  // namespace

void fill(View out, float value) { std::fill_n(out.data, out.shape.numel(), value); }

void unary(ir::Op op, ConstView x, View out) {
  std::int64_t n = out.shape.numel();
  switch (op) {
    case ir::Op::neg: for (std::int64_t i = 0; i < n; ++i) out.data[i] = -x.data[i]; return;
    case ir::Op::exp: for (std::int64_t i = 0; i < n; ++i) out.data[i] = std::exp(x.data[i]); return;
    case ir::Op::log: for (std::int64_t i = 0; i < n; ++i) out.data[i] = std::log(x.data[i]); return;
    case ir::Op::sqrt: for (std::int64_t i = 0; i < n; ++i) out.data[i] = std::sqrt(x.data[i]); return;
    default: QKV_UNREACHABLE("not a unary op");
  }
}

void binary(ir::Op op, ConstView a, ConstView b, View out) {
  switch (op) {
    case ir::Op::add: return binary_impl<ir::Op::add>(a, b, out);
    case ir::Op::sub: return binary_impl<ir::Op::sub>(a, b, out);
    case ir::Op::mul: return binary_impl<ir::Op::mul>(a, b, out);
    case ir::Op::div: return binary_impl<ir::Op::div>(a, b, out);
    case ir::Op::max: return binary_impl<ir::Op::max>(a, b, out);
    default: QKV_UNREACHABLE("not a binary op");
  }
}

void select(ConstView cond, ConstView a, ConstView b, View out) {
  const ir::Shape& os = out.shape;
  OffsetWalker<3> w{os, {broadcast_strides(cond.shape, os), broadcast_strides(a.shape, os), broadcast_strides(b.shape, os)}};
  std::int64_t n = os.numel();
  for (std::int64_t i = 0; i < n; ++i, w.next()) out.data[i] = cond.data[w.offset[0]] != 0.0f ? a.data[w.offset[1]] : b.data[w.offset[2]];
}

void reduce(ir::Op op, ConstView x, int axis, View out) {
  AxisSplit s = split_at(x.shape, axis);
  const bool sum = op == ir::Op::reduce_sum;
  const float init = sum ? 0.0f : -std::numeric_limits<float>::infinity();
  for (std::int64_t o = 0; o < s.outer; ++o) {
    float* dst = out.data + o * s.inner;
    std::fill_n(dst, s.inner, init);
    for (std::int64_t k = 0; k < s.n; ++k) {
      const float* src = x.data + (o * s.n + k) * s.inner;
      if (sum) for (std::int64_t i = 0; i < s.inner; ++i) dst[i] += src[i];
      else for (std::int64_t i = 0; i < s.inner; ++i) dst[i] = apply_binary(ir::Op::max, dst[i], src[i]);
    }
  }
}

void softmax(ConstView x, int axis, View out) {
  AxisSplit s = split_at(x.shape, axis);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      const float* src = x.data + o * s.n * s.inner + i;
      float* dst = out.data + o * s.n * s.inner + i;
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t k = 0; k < s.n; ++k) m = std::max(m, src[k * s.inner]);
      float total = 0.0f;
      for (std::int64_t k = 0; k < s.n; ++k) total += dst[k * s.inner] = std::exp(src[k * s.inner] - m);
      const float inv = 1.0f / total;
      for (std::int64_t k = 0; k < s.n; ++k) dst[k * s.inner] *= inv;
    }
}

void matmul(ConstView a, ConstView b, bool ta, bool tb, View out) {
  MatmulDims d = matmul_dims(a.shape, b.shape, out.shape, ta);
  OffsetWalker<2> w{d.batch_shape, {d.a_batch, d.b_batch}};
  for (std::int64_t bt = 0; bt < d.batch; ++bt, w.next()) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(d.m),
                static_cast<int>(d.n), static_cast<int>(d.k), 1.0f, a.data + w.offset[0] * d.m * d.k, static_cast<int>(ta ? d.m : d.k),
                b.data + w.offset[1] * d.k * d.n, static_cast<int>(tb ? d.k : d.n), 0.0f, out.data + bt * d.m * d.n,
                static_cast<int>(d.n));
  }
}

void permute(ConstView x, const std::array<std::int8_t, ir::kMaxRank>& perm, View out) {
  const ir::Shape& os = out.shape;
  Strides src = contiguous_strides(x.shape), st{};
  for (int i = 0; i < os.rank; ++i) st[static_cast<std::size_t>(i)] = src[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])];
  std::int64_t inner = os.rank ? os.back() : 1;
  std::int64_t step = os.rank ? st[static_cast<std::size_t>(os.rank - 1)] : 0;
  ir::Shape rows = leading(os);
  std::int64_t nrows = rows.numel();
  OffsetWalker<1> w{rows, {st}};
  for (std::int64_t r = 0; r < nrows; ++r, w.next()) {
    const float* s = x.data + w.offset[0];
    float* dst = out.data + r * inner;
    for (std::int64_t i = 0; i < inner; ++i) dst[i] = s[i * step];
  }
}

void causal_mask(ir::CausalAlign align, View out) {
  std::int64_t lq = out.shape[0], lk = out.shape[1];
  std::int64_t shift = align == ir::CausalAlign::bottom_right ? lk - lq : 0;
  for (std::int64_t i = 0; i < lq; ++i)
    for (std::int64_t j = 0; j < lk; ++j) out.data[i * lk + j] = j <= i + shift ? 1.0f : 0.0f;
}

}  // namespace qkv::backend::cpu
