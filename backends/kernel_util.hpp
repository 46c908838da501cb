// Index helpers shared by the host backends' kernels: strides, broadcasting, axis splits.
#pragma once

#include <array>
#include <cstdint>

#include "ir/shape.hpp"

namespace qkv::backend {

using Strides = std::array<std::int64_t, ir::kMaxRank>;

/// Row-major strides of a concrete shape.
inline Strides contiguous_strides(const ir::Shape& s) {
  Strides st{};
  std::int64_t acc = 1;
  for (int i = s.rank - 1; i >= 0; --i) {
    st[static_cast<std::size_t>(i)] = acc;
    acc *= s[i];
  }
  return st;
}

/// Strides for reading `in` (right-aligned) at the indices of `out`: 0 where `in` broadcasts.
inline Strides broadcast_strides(const ir::Shape& in, const ir::Shape& out) {
  Strides st{};
  Strides c = contiguous_strides(in);
  for (int i = 0; i < out.rank; ++i) {
    int j = i - (out.rank - in.rank);
    st[static_cast<std::size_t>(i)] = (j < 0 || in[j] == 1) ? 0 : c[static_cast<std::size_t>(j)];
  }
  return st;
}

/// Walks the row-major indices of `shape`, keeping offsets into N operands with given strides.
template <int N> struct OffsetWalker {
  const ir::Shape& shape;
  std::array<Strides, N> strides;
  std::array<std::int64_t, ir::kMaxRank> index{};
  std::array<std::int64_t, N> offset{};

  /// Moves to the element at row-major position `linear` of shape (from any position).
  void seek(std::int64_t linear) {
    offset = {};
    for (int d = shape.rank - 1; d >= 0; --d) {
      const auto du = static_cast<std::size_t>(d);
      index[du] = linear % shape[d];
      linear /= shape[d];
      for (int k = 0; k < N; ++k) offset[static_cast<std::size_t>(k)] += strides[static_cast<std::size_t>(k)][du] * index[du];
    }
  }

  void next() {
    for (int d = shape.rank - 1; d >= 0; --d) {
      auto du = static_cast<std::size_t>(d);
      ++index[du];
      for (int k = 0; k < N; ++k) offset[static_cast<std::size_t>(k)] += strides[static_cast<std::size_t>(k)][du];
      if (index[du] < shape[d]) return;
      for (int k = 0; k < N; ++k) offset[static_cast<std::size_t>(k)] -= strides[static_cast<std::size_t>(k)][du] * index[du];
      index[du] = 0;
    }
  }
};

/// A shape seen as [outer, n, inner] around one axis.
struct AxisSplit {
  std::int64_t outer = 1, n = 1, inner = 1;
};
inline AxisSplit split_at(const ir::Shape& s, int axis) {
  AxisSplit r;
  for (int i = 0; i < s.rank; ++i) {
    if (i < axis) r.outer *= s[i];
    else if (i == axis) r.n = s[i];
    else r.inner *= s[i];
  }
  return r;
}

/// Batch offsets of a batched matmul: for output batch b, the batch offsets (in matrices) of a
/// and b under broadcasting.
struct MatmulDims {
  std::int64_t batch = 1, m = 0, n = 0, k = 0;
  ir::Shape batch_shape;
  Strides a_batch{}, b_batch{};  // strides in units of whole matrices
};
inline MatmulDims matmul_dims(const ir::Shape& a, const ir::Shape& b, const ir::Shape& out, bool ta) {
  MatmulDims d;
  d.m = out.back(1);
  d.n = out.back(0);
  d.k = ta ? a.back(1) : a.back(0);
  ir::Shape ab, bb;
  for (int i = 0; i + 2 < a.rank; ++i) ab.push_back(a[i]);
  for (int i = 0; i + 2 < b.rank; ++i) bb.push_back(b[i]);
  for (int i = 0; i + 2 < out.rank; ++i) d.batch_shape.push_back(out[i]);
  d.batch = d.batch_shape.numel();
  d.a_batch = broadcast_strides(ab, d.batch_shape);
  d.b_batch = broadcast_strides(bb, d.batch_shape);
  return d;
}

}  // namespace qkv::backend
