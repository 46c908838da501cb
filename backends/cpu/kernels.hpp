// The CPU backend's f32 kernels, one function per op family.
#pragma once

#include <cstdint>

#include "backends/kernel_util.hpp"
#include "ir/op.hpp"

namespace qkv::backend::cpu {

/// A float buffer with its concrete shape. A value may instead be held in f16 or bf16
/// (`stored`, at `half`; `data` unset): only the kernels that say so take one (fused attention's
/// forward reads q, k and v and writes its output so, converting tile by tile).
struct View {
  float* data;
  ir::Shape shape;
  void* half = nullptr;
  DType stored = DType::f32;
};
struct PagedRows;
/// A value as a kernel reads it: `data` (f32), or `half` (f16, bf16: `stored`), or, where `paged`
/// is set, pages read through a block table (page_gather left to its reader: only fused
/// attention's kernels take one, forward, row statistic and gradients, through contiguous(),
/// widen and all_finite).
struct ConstView {
  const float* data;
  ir::Shape shape;
  const void* half = nullptr;
  DType stored = DType::f32;
  const PagedRows* paged = nullptr;
};

/// What page_gather gives, [B, H, n page, D] in row-major order (whatever shape its reader sees
/// it in), read where it lies: row s of sequence b and head h is row s % page of page
/// table[b, s / page] of the pages [P, H, page, D] (in their stored dtype), zeros where the
/// entry is outside [0, P).
struct PagedRows {
  const void* pages;
  DType stored;
  const float* table;  // [B, n]: i32 page numbers, held as floats
  std::int64_t count, heads, page, n, width;
  /// Where element `at` lies in the pages (-1: in a page not allocated, which reads zeros), and in
  /// *run how many elements from it on lie one after another there (to the end of its page).
  std::int64_t locate(std::int64_t at, std::int64_t* run) const {
    const std::int64_t row = at / width, e = at % width, slots = n * page, s = row % slots, head = (row / slots) % heads, b = row / slots / heads;
    *run = (page - s % page) * width - e;
    const auto entry = static_cast<std::int64_t>(table[b * n + s / page]);
    return entry < 0 || entry >= count ? -1 : ((entry * heads + head) * page + s % page) * width + e;
  }
};

/// x's elements [first, first + n) one after another in x's stored dtype, as a view of their own:
/// where x holds them, or for a paged x gathered into this thread's buffer `slot` (0 to 4), where
/// they stay until the next call for that slot.
ConstView contiguous(const ConstView& x, std::int64_t first, std::int64_t n, int slot);

/// x's element `at` where it is stored: in `data` (f32) or in `half` (f16, bf16), for kernels that
/// read x in its stored dtype (few_rows_product). Not for a paged x (see contiguous).
inline const void* stored_at(const ConstView& x, std::int64_t at) {
  if (x.stored == DType::f32) return x.data + at;
  return static_cast<const std::uint16_t*>(x.half) + at;
}
/// x's elements [first, first + n) in f32, into `to` (exactly, whatever x is stored in).
void widen(const ConstView& x, std::int64_t first, std::int64_t n, float* to);
/// from[0, n) into out's elements [first, first + n), rounded to nearest when out is f16 or bf16.
void narrow(const float* from, std::int64_t n, const View& out, std::int64_t first);
/// Whether x's elements [first, first + n) are all finite.
bool all_finite(const ConstView& x, std::int64_t first, std::int64_t n);

void fill(View out, float value);
void unary(ir::Op op, ConstView x, View out);
void binary(ir::Op op, ConstView a, ConstView b, View out);
/// One row of a binary op: out[i] = a[i] op b[i] for i < n, an operand that does not vary read
/// at [0] for every i (a score modifier's step over a row of scores).
void binary_row(ir::Op op, const float* a, bool a_varies, const float* b, bool b_varies, float* out, std::int64_t n);
void select(ConstView cond, ConstView a, ConstView b, View out);
void reduce(ir::Op op, ConstView x, int axis, View out);
void softmax(ConstView x, int axis, View out);
void log_softmax(ConstView x, int axis, View out);
void broadcast(ConstView x, View out);
void one_hot(ConstView ids, std::int64_t depth, View out);
/// out = cache with fresh's rows written at [start, start + T) along `axis` (in place when out.data == cache.data).
void cache_write(ConstView cache, ConstView fresh, ConstView start, int axis, View out);
/// pages [P, H, page, D] with fresh [B, H, T, D] written at slots [B, T] (i32, held as floats).
void page_write(ConstView pages, ConstView fresh, ConstView slots, View out);
/// The rows of pages [P, H, page, D] that table [B, n] names, [B, H, n page, D] (zeros for
/// entries outside [0, P)), in out's dtype.
void page_gather(ConstView pages, ConstView table, View out);
/// The view of page_gather(pages, table) that reads the pages where they are (`rows` holds its layout).
ConstView paged_view(const ConstView& pages, const ConstView& table, const ir::Shape& shape, PagedRows& rows);
/// out[i, :] = table[ids[i], :] (a zero row for ids outside the table); the table may be f16 or bf16.
void embedding(ConstView ids, ConstView table, View out);
/// b may be f16 or bf16 (a half checkpoint's weights): read as it is by few_rows_product, or
/// widened as gemm packs it.
void matmul(ConstView a, ConstView b, bool transpose_a, bool transpose_b, View out);
void permute(ConstView x, const std::array<std::int8_t, ir::kMaxRank>& perm, View out);
void causal_mask(ir::CausalAlign align, std::int64_t window, View out);
void slice(ConstView x, int axis, std::int64_t begin, View out);
void concat(ConstView a, ConstView b, int axis, View out);
void iota(int axis, View out);
void dropout_mask(ConstView seed, double p, View out);

}  // namespace qkv::backend::cpu
