// Kernels of the data-movement and generator ops, written once over the element type and shared
// by the host backends (reference in double or float, cpu in float): slice, concat, iota,
// causal and sliding-window masks, dropout masks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/kernel_util.hpp"
#include "ir/error.hpp"
#include "ir/op.hpp"
#include "ir/random.hpp"

namespace qkv::backend {

/// out = x[begin:begin + n_out] along `axis`, x seen as [outer, n_in, inner].
template <class T>
void slice_rows(const T* x, std::int64_t outer, std::int64_t n_in, std::int64_t inner, std::int64_t begin, std::int64_t n_out, T* out) {
  if (n_out * inner == 1) {  // one element a row (a column sliced off): no copy call per element
    for (std::int64_t o = 0; o < outer; ++o) out[o] = x[(o * n_in + begin) * inner];
    return;
  }
  for (std::int64_t o = 0; o < outer; ++o) std::copy_n(x + (o * n_in + begin) * inner, n_out * inner, out + o * n_out * inner);
}

/// out = a then b along an axis; a is [outer, na, inner], b [outer, nb, inner].
template <class T> void concat_rows(const T* a, std::int64_t na, const T* b, std::int64_t nb, std::int64_t outer, std::int64_t inner, T* out) {
  for (std::int64_t o = 0; o < outer; ++o) {
    T* dst = out + o * (na + nb) * inner;
    std::copy_n(a + o * na * inner, na * inner, dst);
    std::copy_n(b + o * nb * inner, nb * inner, dst + na * inner);
  }
}

/// out = cache [outer, n, inner] with rows [start, start + t) from fresh [outer, t, inner], rows
/// outside [0, n) dropped. With out == cache (in place) only the fresh rows are written.
template <class T>
void cache_write_rows(const T* cache, const T* fresh, std::int64_t outer, std::int64_t n, std::int64_t t, std::int64_t inner, std::int64_t start,
                      T* out) {
  if (out != cache) std::copy_n(cache, outer * n * inner, out);
  const std::int64_t first = std::max<std::int64_t>(0, -start), last = std::min(t, n - start);
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t k = first; k < last; ++k) std::copy_n(fresh + (o * t + k) * inner, inner, out + (o * n + start + k) * inner);
}

/// out = pages [P, H, page, D] with fresh [B, H, T, D]'s rows written at slots [B, T] (slot s:
/// row s % page of page s / page), slots outside [0, P page) dropped. With out == pages (in
/// place) only the fresh rows are written. S: the slots' element type (i32, or the reference's
/// double).
template <class T, class S>
void page_write_rows(const T* pages, const T* fresh, const S* slots, std::int64_t p, std::int64_t h, std::int64_t page, std::int64_t d,
                     std::int64_t b, std::int64_t t, T* out) {
  if (out != pages) std::copy_n(pages, p * h * page * d, out);
  for (std::int64_t i = 0; i < b * t; ++i) {
    const auto slot = static_cast<std::int64_t>(slots[i]);
    if (slot < 0 || slot >= p * page) continue;
    for (std::int64_t head = 0; head < h; ++head)
      std::copy_n(fresh + (((i / t) * h + head) * t + i % t) * d, d, out + (((slot / page) * h + head) * page + slot % page) * d);
  }
}

/// out[..., k, ...] = k along the axis of `s` split as [outer, n, inner].
template <class T> void iota_kernel(const AxisSplit& s, T* out) {
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t k = 0; k < s.n; ++k) std::fill_n(out + (o * s.n + k) * s.inner, s.inner, static_cast<T>(k));
}

/// Boolean [lq, lk] keep-mask (1 keeps): j <= i + shift, and j > i + shift - window when window > 0.
template <class T> void causal_mask_kernel(std::int64_t lq, std::int64_t lk, ir::CausalAlign align, std::int64_t window, T* out) {
  const std::int64_t shift = align == ir::CausalAlign::bottom_right ? lk - lq : 0;
  for (std::int64_t i = 0; i < lq; ++i)
    for (std::int64_t j = 0; j < lk; ++j) {
      const bool keep = j <= i + shift && (window <= 0 || j > i + shift - window);
      out[i * lk + j] = keep ? T(1) : T(0);
    }
}

/// The seed operand of dropout_mask as Philox's key word, checked against its documented range.
template <class T> std::uint32_t dropout_seed(T seed) {
  if (!ir::dropout_seed_ok(static_cast<double>(seed)))
    throw ShapeError("dropout_mask: seed " + std::to_string(static_cast<double>(seed)) + " is outside [0, 2^24)");
  return static_cast<std::uint32_t>(seed);
}

/// n elements of a dropout mask: 0 where dropped, 1/(1-p) where kept.
template <class T> void dropout_mask_kernel(std::uint32_t seed, double p, std::int64_t n, T* out) {
  const std::uint32_t threshold = ir::dropout_threshold(p);
  const T keep = static_cast<T>(ir::dropout_keep_value(p));
  for (std::int64_t i = 0; i < n; ++i) out[i] = ir::dropout_keeps(seed, static_cast<std::uint32_t>(i), threshold) ? keep : T(0);
}

}  // namespace qkv::backend
