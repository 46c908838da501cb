// CPU kernels: contiguous inner loops the compiler vectorises, gemm.hpp's GEMM for matmul.
#include "backends/cpu/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/gemm.hpp"
#include "backends/cpu/gemv.hpp"
#include "backends/cpu/isa.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/cpu/vector_math.hpp"
#include "backends/host_kernels.hpp"
#include "backends/scalar_ops.hpp"
#include "ir/error.hpp"
#include "ir/half.hpp"

namespace qkv::backend::cpu {

namespace {

/// The shape without its last dim (the rows an inner loop runs over).
ir::Shape leading(const ir::Shape& s) {
  ir::Shape r;
  for (int i = 0; i + 1 < s.rank; ++i) r.push_back(s[i]);
  return r;
}

/// out[i] = src[offset of i under `strides`]: the copy behind permute and broadcast_to, a walker
/// over the leading dims and a strided inner loop.
void strided_copy(const float* src, const Strides& strides, View out) {
  const ir::Shape& os = out.shape;
  const std::int64_t inner = os.rank ? os.back() : 1;
  const std::int64_t step = os.rank ? strides[static_cast<std::size_t>(os.rank - 1)] : 0;
  ir::Shape rows = leading(os);
  const std::int64_t nrows = rows.numel();
  OffsetWalker<1> w{rows, {strides}};
  for (std::int64_t r = 0; r < nrows; ++r, w.next())
    for (std::int64_t i = 0; i < inner; ++i) out.data[r * inner + i] = src[w.offset[0] + i * step];
}

template <ir::Op O>
[[gnu::always_inline]] inline void binary_rows(const float* a, const float* b, float* out, std::int64_t n, std::int64_t sa, std::int64_t sb) {
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

/// The pages of a paged view as a view of their own.
ConstView pool_of(const PagedRows& p) {
  return p.stored == DType::f32 ? ConstView{static_cast<const float*>(p.pages), {}} : ConstView{nullptr, {}, p.pages, p.stored};
}

/// Calls f(offset in the pool or -1, count, position from first) for each run of x's elements
/// [first, first + n) that lie one after another in a paged x's pool.
template <class F> void each_run(const PagedRows& p, std::int64_t first, std::int64_t n, F&& f) {
  for (std::int64_t at = first; at < first + n;) {
    std::int64_t run = 0;
    const std::int64_t offset = p.locate(at, &run);
    const std::int64_t take = std::min(run, first + n - at);
    f(offset, take, at - first);
    at += take;
  }
}

}  // namespace

ConstView contiguous(const ConstView& x, std::int64_t first, std::int64_t n, int slot) {
  if (!x.paged) {
    if (x.stored == DType::f32) return {x.data + first, {n}};
    return {nullptr, {n}, static_cast<const std::uint16_t*>(x.half) + first, x.stored};
  }
  if (n == 0) return {nullptr, {0}, nullptr, x.stored};
  std::int64_t run = 0;  // within one page: read where they lie
  if (const std::int64_t offset = x.paged->locate(first, &run); offset >= 0 && run >= n) return contiguous(pool_of(*x.paged), offset, n, slot);
  thread_local std::vector<std::uint32_t> buffers[5];  // 4-byte words: room for f32, and for 16-bit elements in pairs
  std::vector<std::uint32_t>& buf = buffers[slot];
  const std::size_t size = x.stored == DType::f32 ? 4 : 2, words = (static_cast<std::size_t>(n) * size + 3) / 4;
  if (buf.size() < words) buf.resize(words);
  auto* bytes = reinterpret_cast<unsigned char*>(buf.data());
  const auto* pool = static_cast<const unsigned char*>(x.paged->pages);
  each_run(*x.paged, first, n, [&](std::int64_t offset, std::int64_t count, std::int64_t to) {
    unsigned char* dst = bytes + static_cast<std::size_t>(to) * size;
    if (offset < 0) std::fill_n(dst, static_cast<std::size_t>(count) * size, static_cast<unsigned char>(0));
    else std::copy_n(pool + static_cast<std::size_t>(offset) * size, static_cast<std::size_t>(count) * size, dst);
  });
  if (x.stored == DType::f32) return {reinterpret_cast<const float*>(bytes), {n}};
  return {nullptr, {n}, bytes, x.stored};
}

void widen(const ConstView& x, std::int64_t first, std::int64_t n, float* to) {
  if (x.paged) {
    const ConstView pool = pool_of(*x.paged);
    return each_run(*x.paged, first, n, [&](std::int64_t offset, std::int64_t count, std::int64_t at) {
      if (offset < 0) std::fill_n(to + at, count, 0.0f);
      else widen(pool, offset, count, to + at);
    });
  }
  if (x.stored == DType::f16) return to_float(static_cast<const Half*>(x.half) + first, to, n);
  if (x.stored == DType::bf16) return to_float(static_cast<const BFloat16*>(x.half) + first, to, n);
  std::copy_n(x.data + first, n, to);
}

void narrow(const float* from, std::int64_t n, const View& out, std::int64_t first) {
  if (out.stored == DType::f16) return to_half(from, static_cast<Half*>(out.half) + first, n);
  if (out.stored == DType::bf16) return to_bfloat16(from, static_cast<BFloat16*>(out.half) + first, n);
  std::copy_n(from, n, out.data + first);
}

bool all_finite(const ConstView& x, std::int64_t first, std::int64_t n) {
  if (x.paged) {  // the pages' runs (a page not allocated reads zeros)
    const ConstView pool = pool_of(*x.paged);
    bool finite = true;
    each_run(*x.paged, first, n,
             [&](std::int64_t offset, std::int64_t count, std::int64_t) { finite = finite && (offset < 0 || all_finite(pool, offset, count)); });
    return finite;
  }
  if (x.stored == DType::f32) return all_finite(x.data + first, n);
  // All exponent bits set: an infinity or a NaN (f16: 5 bits, bf16: f32's 8).
  const std::uint16_t exponent = x.stored == DType::f16 ? 0x7c00 : 0x7f80;
  const auto* bits = static_cast<const std::uint16_t*>(x.half) + first;
  bool finite = true;
  for (std::int64_t i = 0; i < n; ++i) finite &= (bits[i] & exponent) != exponent;
  return finite;
}

void fill(View out, float value) { std::fill_n(out.data, out.shape.numel(), value); }

void unary(ir::Op op, ConstView x, View out) {
  const std::int64_t n = out.shape.numel();
  if (op == ir::Op::cast) {
    std::copy_n(x.data, n, out.data);
    return;
  }
  // The vectorised ones (vector_math.cpp), in chunks over the pool.
  void (*vectorised)(const float*, float*, std::int64_t) = op == ir::Op::tanh  ? &tanh_of
                                                           : op == ir::Op::erf ? &erf_of
                                                           : op == ir::Op::exp ? &exp_of
                                                                               : nullptr;
  if (vectorised) {
    constexpr std::int64_t kChunk = 1 << 14;
    const std::int64_t chunks = (n + kChunk - 1) / kChunk;
    auto chunk = [&](std::int64_t c) { vectorised(x.data + c * kChunk, out.data + c * kChunk, std::min(kChunk, n - c * kChunk)); };
    if (chunks <= 1) vectorised(x.data, out.data, n);
    else ThreadPool::global().parallel_for(chunks, chunk);
    return;
  }
  // The others: the registry row's host expression, in a loop per op the compiler can vectorise.
#define QKV_UNARY_LOOP(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, ...) \
  if (op == ir::Op::id) {                                                                                                                           \
    for (std::int64_t i = 0; i < n; ++i) out.data[i] = apply_unary(ir::Op::id, x.data[i]);                                                          \
    return;                                                                                                                                         \
  }
  QKV_UNARY_OPS(QKV_UNARY_LOOP)
#undef QKV_UNARY_LOOP
  QKV_UNREACHABLE("not a unary op");
}

namespace {

/// binary_row's loops, inlined into a copy compiled per ISA (the compiler vectorises them for
/// each; `Isa` only names the copy). A chain of ifs rather than a generic lambda per op: a
/// lambda's body would be compiled once, for the baseline.
template <Isa>
[[gnu::always_inline]] inline void binary_row_impl(ir::Op op, const float* a, bool a_varies, const float* b, bool b_varies, float* out,
                                                   std::int64_t n) {
  const std::int64_t sa = a_varies ? 1 : 0, sb = b_varies ? 1 : 0;
#define QKV_BINARY_ROW(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, ...) \
  if (op == ir::Op::id) return binary_rows<ir::Op::id>(a, b, out, n, sa, sb);
  QKV_BINARY_OPS(QKV_BINARY_ROW)
  QKV_COMPARE_OPS(QKV_BINARY_ROW)
#undef QKV_BINARY_ROW
  QKV_UNREACHABLE("not a binary op");
}

}  // namespace

QKV_ISA_DISPATCH(void, binary_row, (ir::Op op, const float* a, bool a_varies, const float* b, bool b_varies, float* out, std::int64_t n),
                 (op, a, a_varies, b, b_varies, out, n), Isa::avx512, Isa::baseline)

void binary(ir::Op op, ConstView a, ConstView b, View out) {
  // Rows of the output's last dim, each one binary_row (compiled per ISA); an operand broadcast
  // along the last dim is read at one element per row. Operands of the output's own shape are one
  // row. Tasks of about 16K elements over the pool.
  const ir::Shape& os = out.shape;
  const std::int64_t n = os.numel();
  if (n == 0) return;
  constexpr std::int64_t kTask = 1 << 14;
  ThreadPool& pool = ThreadPool::global();
  if (a.shape == os && b.shape == os) {
    const std::int64_t tasks = (n + kTask - 1) / kTask;
    auto task = [&](std::int64_t t) {
      const std::int64_t first = t * kTask;
      binary_row(op, a.data + first, true, b.data + first, true, out.data + first, std::min(kTask, n - first));
    };
    if (tasks <= 1) task(0);
    else pool.parallel_for(tasks, task);
    return;
  }
  const std::int64_t inner = os.rank ? os.back() : 1;
  const Strides sa = broadcast_strides(a.shape, os), sb = broadcast_strides(b.shape, os);
  const bool a_varies = os.rank && sa[static_cast<std::size_t>(os.rank - 1)] != 0,
             b_varies = os.rank && sb[static_cast<std::size_t>(os.rank - 1)] != 0;
  const ir::Shape rows = leading(os);
  const std::int64_t nrows = rows.numel(), per_task = std::max<std::int64_t>(1, kTask / inner), tasks = (nrows + per_task - 1) / per_task;
  auto task = [&](std::int64_t t) {
    OffsetWalker<2> w{rows, {sa, sb}};
    const std::int64_t first = t * per_task, last = std::min(nrows, first + per_task);
    w.seek(first);
    for (std::int64_t r = first; r < last; ++r, w.next())
      binary_row(op, a.data + w.offset[0], a_varies, b.data + w.offset[1], b_varies, out.data + r * inner, inner);
  };
  if (tasks <= 1) task(0);
  else pool.parallel_for(tasks, task);
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
  if (s.inner == 1 && s.n > 1) {  // rows are contiguous (a norm's mean): vectorised, rows spread over the pool
    const std::int64_t per_task = std::max<std::int64_t>(1, (1 << 14) / s.n), tasks = (s.outer + per_task - 1) / per_task;
    auto task = [&](std::int64_t t) {
      for (std::int64_t o = t * per_task; o < std::min(s.outer, (t + 1) * per_task); ++o)
        out.data[o] = sum ? sum_of(x.data + o * s.n, s.n) : max_of(x.data + o * s.n, s.n, init);
    };
    if (tasks <= 1) task(0);
    else ThreadPool::global().parallel_for(tasks, task);
    return;
  }
  for (std::int64_t o = 0; o < s.outer; ++o) {
    float* dst = out.data + o * s.inner;
    std::fill_n(dst, s.inner, init);
    for (std::int64_t k = 0; k < s.n; ++k) {
      const float* src = x.data + (o * s.n + k) * s.inner;
      if (sum)
        for (std::int64_t i = 0; i < s.inner; ++i) dst[i] += src[i];
      else
        for (std::int64_t i = 0; i < s.inner; ++i) dst[i] = apply_binary(ir::Op::max, dst[i], src[i]);
    }
  }
}

void softmax(ConstView x, int axis, View out) {
  AxisSplit s = split_at(x.shape, axis);
  if (s.inner == 1) {  // rows are contiguous: vectorised exp, rows spread over the pool
    const std::int64_t per_task = std::max<std::int64_t>(1, (1 << 14) / std::max<std::int64_t>(s.n, 1));
    const std::int64_t tasks = (s.outer + per_task - 1) / per_task;
    auto task = [&](std::int64_t t) {
      for (std::int64_t o = t * per_task; o < std::min(s.outer, (t + 1) * per_task); ++o) {
        const float* src = x.data + o * s.n;
        float* dst = out.data + o * s.n;
        const float m = max_of(src, s.n, -std::numeric_limits<float>::infinity());
        std::copy_n(src, s.n, dst);
        if (m != m) {  // a NaN in the row: every weight is NaN, as exp(x - max) / sum defines
          std::fill_n(dst, s.n, m);
          continue;
        }
        // A row of -inf (every key masked) gives zeros, as the decomposition defines.
        if (m == -std::numeric_limits<float>::infinity()) {
          std::fill_n(dst, s.n, 0.0f);
          continue;
        }
        divide_inplace(dst, s.n, exp_shifted_sum(dst, s.n, m));
      }
    };
    if (tasks == 1) task(0);
    else ThreadPool::global().parallel_for(tasks, task);
    return;
  }
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      const float* src = x.data + o * s.n * s.inner + i;
      float* dst = out.data + o * s.n * s.inner + i;
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t k = 0; k < s.n; ++k) m = apply_binary(ir::Op::max, m, src[k * s.inner]);  // NaN propagates
      if (m == -std::numeric_limits<float>::infinity()) m = 0.0f;                                 // a row of -inf gives zeros
      float total = 0.0f;
      for (std::int64_t k = 0; k < s.n; ++k) total += dst[k * s.inner] = std::exp(src[k * s.inner] - m);
      const float inv = total == 0.0f ? 0.0f : 1.0f / total;
      for (std::int64_t k = 0; k < s.n; ++k) dst[k * s.inner] *= inv;
    }
}

void log_softmax(ConstView x, int axis, View out) {
  AxisSplit s = split_at(x.shape, axis);
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      const float* src = x.data + o * s.n * s.inner + i;
      float* dst = out.data + o * s.n * s.inner + i;
      float m = -std::numeric_limits<float>::infinity();
      for (std::int64_t k = 0; k < s.n; ++k) m = apply_binary(ir::Op::max, m, src[k * s.inner]);  // NaN propagates
      float total = 0.0f;
      for (std::int64_t k = 0; k < s.n; ++k) total += std::exp(src[k * s.inner] - m);
      const float shift = m + std::log(total);
      for (std::int64_t k = 0; k < s.n; ++k) dst[k * s.inner] = src[k * s.inner] - shift;
    }
}

void broadcast(ConstView x, View out) { strided_copy(x.data, broadcast_strides(x.shape, out.shape), out); }

void one_hot(ConstView ids, std::int64_t depth, View out) {
  std::fill_n(out.data, out.shape.numel(), 0.0f);
  const std::int64_t n = ids.shape.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<std::int64_t>(ids.data[i]);
    if (id >= 0 && id < depth) out.data[i * depth + id] = 1.0f;
  }
}

void embedding(ConstView ids, ConstView table, View out) {
  const std::int64_t rows = table.shape[0], width = rows == 0 ? 0 : table.shape.numel() / rows, n = ids.shape.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<std::int64_t>(ids.data[i]);
    float* dst = out.data + i * width;
    if (id >= 0 && id < rows) widen(table, id * width, width, dst);  // f32, or an f16 or bf16 table's row widened
    else std::fill_n(dst, width, 0.0f);
  }
}

void matmul(ConstView a, ConstView b, bool ta, bool tb, View out) {
  MatmulDims d = matmul_dims(a.shape, b.shape, out.shape, ta);
  // One matrix B for every batch entry, and a's entries one after another: one product of all
  // their rows (a batch of decode steps reads B once).
  if (!ta && b.shape.rank == 2 && a.shape.rank == out.shape.rank) {
    d.m *= d.batch;
    d.batch = 1;
  }
  // Batch entry bt's offsets into a and b, in matrices (broadcast batch dims stride 0).
  auto batch_offsets = [&](std::int64_t bt) {
    std::int64_t oa = 0, ob = 0, rem = bt;
    for (int i = d.batch_shape.rank - 1; i >= 0; --i) {
      oa += (rem % d.batch_shape[i]) * d.a_batch[static_cast<std::size_t>(i)];
      ob += (rem % d.batch_shape[i]) * d.b_batch[static_cast<std::size_t>(i)];
      rem /= d.batch_shape[i];
    }
    return std::pair{oa, ob};
  };
  // Few rows (decode steps): bound by reading B, which few_rows_product streams once.
  if (!ta && d.m >= 1 && d.m <= kFewRows) {
    for (std::int64_t bt = 0; bt < d.batch; ++bt) {
      const auto [oa, ob] = batch_offsets(bt);
      few_rows_product(a.data + oa * d.m * d.k, d.m, d.k, d.n, stored_at(b, ob * d.k * d.n), b.stored, tb, out.data + bt * d.m * d.n);
    }
    return;
  }
  // The rest: packed GEMM (a half B widened as it is packed, never whole).
  const GemmShape shape{d.m, d.n, d.k, ta, tb, ta ? d.m : d.k, tb ? d.k : d.n, d.n, b.stored};
  std::vector<GemmOperands> entries(static_cast<std::size_t>(d.batch));
  for (std::int64_t bt = 0; bt < d.batch; ++bt) {
    const auto [oa, ob] = batch_offsets(bt);
    entries[static_cast<std::size_t>(bt)] = {a.data + oa * d.m * d.k, stored_at(b, ob * d.k * d.n), out.data + bt * d.m * d.n};
  }
  gemm(shape, entries);
}

void permute(ConstView x, const std::array<std::int8_t, ir::kMaxRank>& perm, View out) {
  Strides src = contiguous_strides(x.shape), st{};
  for (int i = 0; i < out.shape.rank; ++i) st[static_cast<std::size_t>(i)] = src[static_cast<std::size_t>(perm[static_cast<std::size_t>(i)])];
  strided_copy(x.data, st, out);
}

void causal_mask(ir::CausalAlign align, std::int64_t window, View out) { causal_mask_kernel(out.shape[0], out.shape[1], align, window, out.data); }

void slice(ConstView x, int axis, std::int64_t begin, View out) {
  AxisSplit s = split_at(x.shape, axis);
  slice_rows(x.data, s.outer, s.n, s.inner, begin, out.shape[axis], out.data);
}

void concat(ConstView a, ConstView b, int axis, View out) {
  AxisSplit s = split_at(a.shape, axis);
  concat_rows(a.data, s.n, b.data, b.shape[axis], s.outer, s.inner, out.data);
}

void cache_write(ConstView cache, ConstView fresh, ConstView start, int axis, View out) {
  AxisSplit s = split_at(cache.shape, axis);
  cache_write_rows(cache.data, fresh.data, s.outer, s.n, fresh.shape[axis], s.inner, static_cast<std::int64_t>(start.data[0]), out.data);
}

void page_write(ConstView pages, ConstView fresh, ConstView slots, View out) {
  page_write_rows(pages.data, fresh.data, slots.data, pages.shape[0], pages.shape[1], pages.shape[2], pages.shape[3], fresh.shape[0], fresh.shape[2],
                  out.data);
}

ConstView paged_view(const ConstView& pages, const ConstView& table, const ir::Shape& shape, PagedRows& rows) {
  rows = {pages.stored == DType::f32 ? static_cast<const void*>(pages.data) : pages.half,
          pages.stored,
          table.data,
          pages.shape[0],
          pages.shape[1],
          pages.shape[2],
          table.shape[1],
          pages.shape[3]};
  return {nullptr, shape, nullptr, pages.stored, &rows};
}

void page_gather(ConstView pages, ConstView table, View out) {
  PagedRows rows{};
  const ConstView x = paged_view(pages, table, out.shape, rows);
  const std::int64_t n = out.shape.numel();
  if (out.stored == DType::f32) return widen(x, 0, n, out.data);
  QKV_ASSERT(out.stored == pages.stored, "page_gather keeps the pages' dtype");
  const ConstView c = contiguous(x, 0, n, 0);
  std::copy_n(static_cast<const std::uint16_t*>(c.half), n, static_cast<std::uint16_t*>(out.half));
}

void iota(int axis, View out) { iota_kernel(split_at(out.shape, axis), out.data); }

void dropout_mask(ConstView seed, double p, View out) {
  // The vectorised factors fused attention draws too (the reference's scalar kernel is the check).
  dropout_factors(dropout_seed(seed.data[0]), ir::dropout_threshold(p), static_cast<float>(ir::dropout_keep_value(p)), 0, out.data,
                  out.shape.numel());
}

}  // namespace qkv::backend::cpu
