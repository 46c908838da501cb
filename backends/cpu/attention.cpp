// Fused attention: per (batch, query block) task, stream key blocks through sgemm and an online
// softmax.
#include "backends/cpu/attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/thread_pool.hpp"
#include "backends/cpu/vector_math.hpp"

namespace qkv::backend::cpu {

namespace {

/// Element offset of linear batch index b under `strides` over `shape`.
std::int64_t offset_at(std::int64_t b, const ir::Shape& shape, const Strides& strides) {
  std::int64_t off = 0;
  for (int d = shape.rank - 1; d >= 0; --d) {
    off += (b % shape[d]) * strides[static_cast<std::size_t>(d)];
    b /= shape[d];
  }
  return off;
}

ir::Shape batch_of(const ir::Shape& s) {
  ir::Shape r;
  for (int i = 0; i + 2 < s.rank; ++i) r.push_back(s[i]);
  return r;
}

/// Element strides over `batch` for a tensor whose last two dims form a matrix of `matrix` elements.
Strides batch_strides(const ir::Shape& s, const ir::Shape& batch, std::int64_t matrix) {
  Strides st = broadcast_strides(batch_of(s), batch);
  for (int i = 0; i < batch.rank; ++i) st[static_cast<std::size_t>(i)] *= matrix;
  return st;
}

}  // namespace

void attention(const AttentionArgs& a) {
  const ir::Shape& os = a.out.shape;
  const std::int64_t n = os.back(1), dv = os.back(0), d = a.q.shape.back(0), m = a.k.shape.back(1);
  const ir::Shape batch = batch_of(os);
  const std::int64_t batches = batch.numel();
  const Strides qs = batch_strides(a.q.shape, batch, n * d), ks = batch_strides(a.k.shape, batch, m * d),
                vs = batch_strides(a.v.shape, batch, m * dv);
  // The mask over the full score shape [batch..., N, M]: batch, row and column strides.
  ir::Shape scores = batch;
  scores.push_back(n);
  scores.push_back(m);
  Strides ms{};
  std::int64_t mask_row = 0, mask_col = 0;
  if (a.mask) {
    Strides full = broadcast_strides(a.mask->shape, scores);
    for (int i = 0; i < batch.rank; ++i) ms[static_cast<std::size_t>(i)] = full[static_cast<std::size_t>(i)];
    mask_row = full[static_cast<std::size_t>(scores.rank - 2)];
    mask_col = full[static_cast<std::size_t>(scores.rank - 1)];
  }
  const std::int64_t shift = a.align == ir::CausalAlign::bottom_right ? m - n : 0;
  const std::int64_t blocks = (n + kQueryBlock - 1) / kQueryBlock;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Skipping key blocks that causality or the window masks is exact only while those keys'
  // values are finite: the meaning (softmax weights @ v) multiplies a masked key's value by a
  // weight of 0, and 0 * NaN or 0 * inf is NaN. A batch whose v holds one processes every block.
  std::vector<std::uint8_t> nonfinite_v(static_cast<std::size_t>(a.causal ? batches : 0), 0);
  if (a.causal)
    ThreadPool::global().parallel_for(batches, [&](std::int64_t b) {
      const float* v = a.v.data + offset_at(b, batch, vs);
      bool bad = false;
      for (std::int64_t i = 0; i < m * dv; ++i) bad |= !std::isfinite(v[i]);
      nonfinite_v[static_cast<std::size_t>(b)] = bad;
    });

  ThreadPool::global().parallel_for(batches * blocks, [&](std::int64_t task) {
    thread_local std::vector<float> s_buf, m_buf, l_buf;
    const std::int64_t b = task / blocks, i0 = (task % blocks) * kQueryBlock;
    const std::int64_t rows = std::min(kQueryBlock, n - i0);
    const float* q = a.q.data + offset_at(b, batch, qs) + i0 * d;
    const float* k = a.k.data + offset_at(b, batch, ks);
    const float* v = a.v.data + offset_at(b, batch, vs);
    const float* mask = a.mask ? a.mask->data + offset_at(b, batch, ms) : nullptr;
    float* o = a.out.data + b * n * dv + i0 * dv;
    s_buf.resize(static_cast<std::size_t>(kQueryBlock * kKeyBlock));
    m_buf.assign(static_cast<std::size_t>(rows), kNegInf);
    l_buf.assign(static_cast<std::size_t>(rows), 0.0f);
    std::fill_n(o, rows * dv, 0.0f);
    // Keys past the causal limit of this block's last row are never needed, nor (with a sliding
    // window) keys before the first row's window: unless v holds a NaN or inf (above).
    const bool skip = a.causal && !nonfinite_v[static_cast<std::size_t>(b)];
    const std::int64_t key_end = skip ? std::clamp<std::int64_t>(i0 + rows + shift, 0, m) : m;
    const std::int64_t key_begin = skip && a.window > 0 ? std::clamp<std::int64_t>(i0 + shift - a.window + 1, 0, m) : 0;
    for (std::int64_t j0 = key_begin; j0 < key_end; j0 += kKeyBlock) {
      const std::int64_t cols = std::min(kKeyBlock, key_end - j0);
      float* s = s_buf.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(d), a.scale, q,
                  static_cast<int>(d), k + j0 * d, static_cast<int>(d), 0.0f, s, static_cast<int>(kKeyBlock));
      for (std::int64_t i = 0; i < rows; ++i) {
        float* row = s + i * kKeyBlock;
        if (mask) {
          const float* mr = mask + (i0 + i) * mask_row + j0 * mask_col;
          for (std::int64_t j = 0; j < cols; ++j) row[j] = mr[j * mask_col] != 0.0f ? row[j] : kNegInf;
        }
        if (a.causal) {
          const std::int64_t limit = i0 + i + shift - j0;  // keys j <= limit are kept
          for (std::int64_t j = std::max<std::int64_t>(limit + 1, 0); j < cols; ++j) row[j] = kNegInf;
          if (a.window > 0)  // keys j <= limit - window are outside the window
            for (std::int64_t j = 0; j < std::min<std::int64_t>(limit - a.window + 1, cols); ++j) row[j] = kNegInf;
        }
        float& mi = m_buf[static_cast<std::size_t>(i)];
        float& li = l_buf[static_cast<std::size_t>(i)];
        const float mx = max_of(row, cols, mi);
        if (mx == kNegInf) {  // every key so far is masked: nothing to add
          std::fill_n(row, cols, 0.0f);
          continue;
        }
        const float correction = mi == kNegInf ? 0.0f : std::exp(mi - mx);
        li = li * correction + exp_shifted_sum(row, cols, mx);
        if (correction != 1.0f) scale_inplace(o + i * dv, dv, correction);
        mi = mx;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(dv), static_cast<int>(cols), 1.0f, s,
                  static_cast<int>(kKeyBlock), v + j0 * dv, static_cast<int>(dv), 1.0f, o, static_cast<int>(dv));
    }
    // A query with no key left (l = 0) gives zeros, as softmax defines for a row of -inf.
    for (std::int64_t i = 0; i < rows; ++i) {
      const float l = l_buf[static_cast<std::size_t>(i)];
      scale_inplace(o + i * dv, dv, l == 0.0f ? 0.0f : 1.0f / l);
    }
  });
}

}  // namespace qkv::backend::cpu
