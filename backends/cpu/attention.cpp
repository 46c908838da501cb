// Fused attention: per (batch, query block) or (batch, key block) task, stream the other
// operand's blocks through sgemm, so no task holds more than a tile of scores.
#include "backends/cpu/attention.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/cpu/gemv.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/cpu/tile_gemm.hpp"
#include "backends/cpu/vector_math.hpp"
#include "ir/random.hpp"

namespace qkv::backend::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

/// Rows [j0, j0 + cols) of a row-major [.., d] matrix (k or v), transposed: B of the products
/// with kT and vT, its columns padded with zeros to a multiple of tile_gemm_columns().
struct Transposed {
  const float* data;
  std::int64_t ld;
  /// No transposed keys: compute reads them as stored (Scores::few_queries).
  static Transposed as_stored() { return {nullptr, -1}; }
  bool is_stored() const { return ld < 0; }
  /// The same from column c on (c a multiple of tile_gemm_columns(), so its padding stays inside).
  Transposed from(std::int64_t c) const { return is_stored() ? *this : Transposed{data + c, ld}; }
};

/// This thread's buffer `slot` (0: keys, 1: values, 2: queries, 3: values' rows, 4: dy's rows,
/// 5, 6, 7: the tangents of the queries, keys and values) of at least `n` floats: what a widened
/// f16 or bf16 tile is read from until the next call for that slot.
float* tile_buffer(int slot, std::int64_t n) {
  thread_local std::vector<float> buffers[8];
  std::vector<float>& buf = buffers[slot];
  if (buf.size() < static_cast<std::size_t>(n)) buf.resize(static_cast<std::size_t>(n));
  return buf.data();
}

/// `rows` rows of `width` from element `first` of x, in f32: where x holds them, or widened into
/// this thread's buffer `slot` when x is stored in f16 or bf16.
const float* f32_rows(const ConstView& x, std::int64_t first, std::int64_t rows, std::int64_t width, int slot) {
  if (x.paged) return f32_rows(contiguous(x, first, rows * width, slot), 0, rows, width, slot);  // gathered, then widened where 16-bit
  if (x.stored == DType::f32) return x.data + first;
  float* to = tile_buffer(slot, rows * width);
  widen(x, first, rows * width, to);
  return to;
}

/// Where a gradient's elements [first, first + n) of `out` accumulate, zeroed: in place when out
/// is f32, else in this thread's accumulator `slot` (0: dq, 1: dk, 2: dv), which settle rounds
/// into out once every tile has added to it.
float* accumulator(const View& out, std::int64_t first, std::int64_t n, int slot) {
  thread_local std::vector<float> buffers[3];
  float* acc = out.stored == DType::f32 ? out.data + first : nullptr;
  if (!acc) {
    std::vector<float>& buf = buffers[slot];
    if (buf.size() < static_cast<std::size_t>(n)) buf.resize(static_cast<std::size_t>(n));
    acc = buf.data();
  }
  std::fill_n(acc, n, 0.0f);
  return acc;
}

/// The accumulated gradient into out's 16-bit elements [first, first + n), rounded once (nothing
/// to do when it accumulated in place).
void settle(const View& out, std::int64_t first, std::int64_t n, const float* acc) {
  if (out.stored != DType::f32) narrow(acc, n, out, first);
}

/// Transposes x's `cols` rows of d into this thread's buffer `slot` (0: keys, 1: values, 2: the
/// keys' tangents), which the result points into until the next call for that slot.
Transposed transposed(const float* x, std::int64_t cols, std::int64_t d, int slot) {
  thread_local std::vector<float> buffers[3];
  const std::int64_t unit = tile_gemm_columns(), ld = (cols + unit - 1) / unit * unit;
  std::vector<float>& buf = buffers[slot];
  if (buf.size() < static_cast<std::size_t>(ld * d)) buf.resize(static_cast<std::size_t>(ld * d));
  transpose_into(x, cols, d, d, buf.data(), ld, ld);
  return {buf.data(), ld};
}

/// Whether the values of a forward attention are finite, key tile by key tile, each tile checked
/// once, when a skip first needs it: leaving masked keys out is exact only while their values are
/// finite (softmax weights @ v multiplies a masked key's value by a weight of 0, and 0 * NaN is
/// NaN). A decode step thereby reads the values of the tiles it leaves out (the slots of a cache
/// sized for the longest sequence that are not written yet), not every value of the cache again.
class FiniteValues {
 public:
  FiniteValues(const ConstView& v, const ir::Shape& batch, const Strides& strides, std::int64_t m, std::int64_t dv, std::int64_t batches)
      : v_(v), batch_(batch), strides_(strides), m_(m), dv_(dv), tiles_((m + kKeyBlock - 1) / kKeyBlock) {
    const auto count = static_cast<std::size_t>(batches * tiles_);
    if (count > few_.size()) many_ = std::vector<std::atomic<std::uint8_t>>(count);
    state_ = count > few_.size() ? many_.data() : few_.data();
  }

  /// Whether batch entry b's values of keys [j0, j1) are all finite (checked a tile at a time).
  bool rows(std::int64_t b, std::int64_t j0, std::int64_t j1) const {
    for (std::int64_t t = j0 / kKeyBlock; t * kKeyBlock < j1; ++t) {
      std::atomic<std::uint8_t>& known = state_[b * tiles_ + t];
      std::uint8_t k = known.load(std::memory_order_relaxed);  // 0: not checked, 1: finite, 2: not
      if (k == 0) {
        const std::int64_t first = t * kKeyBlock, count = std::min(kKeyBlock, m_ - first);
        k = all_finite(v_, offset_at(b, batch_, strides_) + first * dv_, count * dv_) ? 1 : 2;
        known.store(k, std::memory_order_relaxed);  // tasks that check it at once find the same
      }
      if (k == 2) return false;
    }
    return true;
  }

 private:
  const ConstView& v_;
  const ir::Shape& batch_;
  const Strides& strides_;
  std::int64_t m_, dv_, tiles_;
  // Per tile of keys 0: not checked, 1: finite, 2: not; held in place for a few tiles (a small
  // graph's run allocates nothing here).
  mutable std::array<std::atomic<std::uint8_t>, 64> few_{};
  mutable std::vector<std::atomic<std::uint8_t>> many_;
  std::atomic<std::uint8_t>* state_;
};

/// One batch entry's queries and keys as runs of packed sequences, where a document mask keeps a
/// key only for queries of its own id (ScoreModifier::document_ids: varlen's sequence numbers).
/// Tiles start at each run's first row and never cross into the next run, so a sequence's rows
/// meet its keys in the tiles, and sum them in the order, that they would alone: its bits do
/// not depend on what is packed around it (batch invariance). Without a document mask, one run
/// of all the queries and one of all the keys.
class Packing {
 public:
  /// The unpacked runs: all n queries, all m keys (no allocation: a small graph's run pays none).
  Packing(std::int64_t n, std::int64_t m) : n_(n), m_(m) {}
  /// The runs of equal ids (see pack).
  Packing(std::int64_t n, std::int64_t m, std::vector<std::int64_t> q, std::vector<std::int64_t> k)
      : n_(n), m_(m), q_(std::move(q)), k_(std::move(k)) {}

  std::int32_t query_runs() const { return q_.empty() ? 1 : static_cast<std::int32_t>(q_.size()) - 1; }
  std::int32_t key_runs() const { return k_.empty() ? 1 : static_cast<std::int32_t>(k_.size()) - 1; }
  /// Query run r's first query (key run r's first key); N (M) for r = query_runs() (key_runs()).
  std::int64_t query_start(std::int32_t r) const { return q_.empty() ? (r == 0 ? 0 : n_) : q_[static_cast<std::size_t>(r)]; }
  std::int64_t key_start(std::int32_t r) const { return k_.empty() ? (r == 0 ? 0 : m_) : k_[static_cast<std::size_t>(r)]; }
  /// The run holding query i (key j).
  std::int32_t query_run(std::int64_t i) const { return run_of(q_, i); }
  std::int32_t key_run(std::int64_t j) const { return run_of(k_, j); }
  /// The key runs of query run r's id (the query runs of key run r's id), ascending.
  std::span<const std::int32_t> keys_of(std::int32_t r) const { return runs_of(keys_of_, r); }
  std::span<const std::int32_t> queries_of(std::int32_t r) const { return runs_of(queries_of_, r); }

 private:
  friend std::optional<Packing> pack(const ScoreModifier::DocumentIds& ids, std::int64_t n, std::int64_t m);
  static constexpr std::array<std::int32_t, 1> kFirst{0};
  static std::span<const std::int32_t> runs_of(const std::vector<std::vector<std::int32_t>>& of, std::int32_t r) {
    return of.empty() ? std::span<const std::int32_t>(kFirst) : std::span<const std::int32_t>(of[static_cast<std::size_t>(r)]);
  }
  static std::int32_t run_of(const std::vector<std::int64_t>& starts, std::int64_t x) {
    if (starts.empty()) return 0;
    return static_cast<std::int32_t>(std::upper_bound(starts.begin(), starts.end() - 1, x) - starts.begin() - 1);
  }
  std::int64_t n_, m_;
  std::vector<std::int64_t> q_, k_;                              // run starts, then N (M); empty: one run
  std::vector<std::vector<std::int32_t>> keys_of_, queries_of_;  // per run: the other side's runs of its id
};

/// The runs of equal ids of n queries and m keys: a run per sequence. The single runs instead
/// when tiling the runs would cost more than three times the tiles of the plain loops (N/256 x
/// M/256 pairs; sequences so short and interleaved that the tiles would be a few rows each): a
/// packed batch of contiguous sequences never does (at most N/256 x M/256 + N/256 + M/256 + S pairs).
std::optional<Packing> pack(const ScoreModifier::DocumentIds& ids, std::int64_t n, std::int64_t m) {
  if (n == 0 || m == 0) return std::nullopt;
  std::vector<std::int64_t> q_starts, k_starts;
  std::vector<float> q_id, k_id;
  auto runs = [](const float* x, std::int64_t stride, std::int64_t len, std::vector<std::int64_t>& starts, std::vector<float>& id) {
    starts.clear();
    for (std::int64_t i = 0; i < len; ++i) {
      const float v = x[i * stride];
      if (i == 0 || !(v == id.back() || (std::isnan(v) && std::isnan(id.back())))) {
        starts.push_back(i);
        id.push_back(v);
      }
    }
    starts.push_back(len);
  };
  runs(ids.q, ids.q_stride, n, q_starts, q_id);
  runs(ids.k, ids.k_stride, m, k_starts, k_id);
  Packing p(n, m, std::move(q_starts), std::move(k_starts));
  // Runs of one id meet (a NaN id meets none): both sides' runs sorted by id, then merged.
  auto by_id = [](const std::vector<float>& id) {
    std::vector<std::int32_t> order;
    for (std::size_t r = 0; r < id.size(); ++r)
      if (!std::isnan(id[r])) order.push_back(static_cast<std::int32_t>(r));
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int32_t x, std::int32_t y) { return id[static_cast<std::size_t>(x)] < id[static_cast<std::size_t>(y)]; });
    return order;
  };
  const std::vector<std::int32_t> qs = by_id(q_id), ks = by_id(k_id);
  // f(a, a_end, c, c_end) for each id: query runs qs[a, a_end) and key runs ks[c, c_end) hold it.
  auto each_id = [&](auto f) {
    for (std::size_t a = 0, c = 0; a < qs.size();) {
      const float id = q_id[static_cast<std::size_t>(qs[a])];
      while (c < ks.size() && k_id[static_cast<std::size_t>(ks[c])] < id) ++c;
      std::size_t c_end = c, a_end = a;
      while (c_end < ks.size() && k_id[static_cast<std::size_t>(ks[c_end])] == id) ++c_end;
      while (a_end < qs.size() && q_id[static_cast<std::size_t>(qs[a_end])] == id) ++a_end;
      f(a, a_end, c, c_end);
      a = a_end;
      c = c_end;
    }
  };
  // The pairs of tiles first, before any list is kept (ids that alternate would make them long).
  auto tiles = [](std::int64_t len, std::int64_t block) { return (len + block - 1) / block; };
  std::int64_t pairs = 0;
  each_id([&](std::size_t a, std::size_t a_end, std::size_t c, std::size_t c_end) {
    std::int64_t q_tiles = 0, k_tiles = 0;
    for (std::size_t e = a; e < a_end; ++e) q_tiles += tiles(p.query_start(qs[e] + 1) - p.query_start(qs[e]), kQueryBlock);
    for (std::size_t e = c; e < c_end; ++e) k_tiles += tiles(p.key_start(ks[e] + 1) - p.key_start(ks[e]), kKeyBlock);
    pairs += q_tiles * k_tiles;
  });
  if (pairs > 3 * tiles(n, kQueryBlock) * tiles(m, kKeyBlock) + p.query_runs()) return std::nullopt;
  p.keys_of_.assign(q_id.size(), {});
  p.queries_of_.assign(k_id.size(), {});
  each_id([&](std::size_t a, std::size_t a_end, std::size_t c, std::size_t c_end) {
    for (std::size_t e = a; e < a_end; ++e)
      p.keys_of_[static_cast<std::size_t>(qs[e])].assign(ks.begin() + static_cast<std::ptrdiff_t>(c),
                                                         ks.begin() + static_cast<std::ptrdiff_t>(c_end));
    for (std::size_t e = c; e < c_end; ++e)
      p.queries_of_[static_cast<std::size_t>(ks[e])].assign(qs.begin() + static_cast<std::ptrdiff_t>(a),
                                                            qs.begin() + static_cast<std::ptrdiff_t>(a_end));
  });
  return p;
}

/// A tile of one batch entry's rows: queries (or keys) [first, first + count) of entry b.
struct Tile {
  std::int64_t b, first, count;
};

/// Every batch entry's tiles, entry by entry: listed where sequences are packed, computed from the
/// index otherwise (tiles of `block` rows from row 0 of each entry's `extent`; nothing allocated).
class Tiles {
 public:
  Tiles(std::int64_t batches, std::int64_t block, std::int64_t extent)
      : block_(block), extent_(extent), per_entry_((extent + block - 1) / block), size_(batches * per_entry_) {}
  explicit Tiles(std::vector<Tile> list) : size_(static_cast<std::int64_t>(list.size())), list_(std::move(list)) {}
  std::int64_t size() const { return size_; }
  Tile operator[](std::int64_t i) const {
    if (!list_.empty()) return list_[static_cast<std::size_t>(i)];
    const std::int64_t first = i % per_entry_ * block_;
    return {i / per_entry_, first, std::min(block_, extent_ - first)};
  }

 private:
  std::int64_t block_ = 0, extent_ = 0, per_entry_ = 1, size_;
  std::vector<Tile> list_;
};

/// The masked scores of one attention, tile by tile, over the batch dims `batch` of the
/// kernel's output.
class Scores {
 public:
  Scores(const ScoreArgs& a, const ir::Shape& batch)
      : a_(a), batch_(batch), n_(a.q.shape.back(1)), m_(a.k.shape.back(1)), d_(a.q.shape.back(0)), qs_(batch_strides(a.q.shape, batch, n_ * d_)),
        ks_(batch_strides(a.k.shape, batch, m_ * d_)), shift_(a.align == ir::CausalAlign::bottom_right ? m_ - n_ : 0) {
    if (a.mod && a.mod->document_ids(0)) {  // packed sequences: each batch entry's runs, once per distinct ids
      std::map<std::pair<const float*, const float*>, std::int32_t> seen;
      for (std::int64_t b = 0; b < batches(); ++b) {
        const ScoreModifier::DocumentIds ids = *a.mod->document_ids(b);
        auto [at, fresh] = seen.try_emplace({ids.q, ids.k}, -1);
        if (fresh)
          if (std::optional<Packing> p = pack(ids, n_, m_)) {
            at->second = static_cast<std::int32_t>(packings_.size());
            packings_.push_back(std::move(*p));
          }
        packing_of_.push_back(at->second);
      }
    }
    if (!a.mask) return;
    ir::Shape scores = batch;
    scores.push_back(n_);
    scores.push_back(m_);
    Strides full = broadcast_strides(a.mask->shape, scores);
    for (int i = 0; i < batch.rank; ++i) ms_[static_cast<std::size_t>(i)] = full[static_cast<std::size_t>(i)];
    mask_row_ = full[static_cast<std::size_t>(scores.rank - 2)];
    mask_col_ = full[static_cast<std::size_t>(scores.rank - 1)];
  }

  std::int64_t n() const { return n_; }
  std::int64_t m() const { return m_; }
  std::int64_t d() const { return d_; }
  std::int64_t batches() const { return batch_.numel(); }
  const ir::Shape& batch() const { return batch_; }
  float scale() const { return a_.scale; }
  /// Whether ds must be multiplied by the modifier's derivative.
  bool has_derivative() const { return a_.mod && a_.mod->has_derivative(); }
  /// Whether batch entry b's queries and keys are all finite.
  bool finite_operands(std::int64_t b) const {
    return all_finite(a_.q, offset_at(b, batch_, qs_), n_ * d_) && all_finite(a_.k, offset_at(b, batch_, ks_), m_ * d_);
  }
  /// Queries [i0, i0 + rows) of batch entry b in f32 (widened into this thread's slot 2 when q
  /// is f16 or bf16: a tile's conversion is 1/(2 kKeyBlock) of its product's work).
  const float* queries(std::int64_t b, std::int64_t i0, std::int64_t rows) const {
    return f32_rows(a_.q, offset_at(b, batch_, qs_) + i0 * d_, rows, d_, 2);
  }

  /// Keys [j0, j0 + cols) of batch entry b in f32 rows (widened into this thread's slot 0 when
  /// k is f16 or bf16).
  const float* key_rows(std::int64_t b, std::int64_t j0, std::int64_t cols) const {
    return f32_rows(a_.k, offset_at(b, batch_, ks_) + j0 * d_, cols, d_, 0);
  }
  /// Keys [j0, j0 + cols) of batch entry b transposed (this thread's slot 0), for compute.
  Transposed keys(std::int64_t b, std::int64_t j0, std::int64_t cols) const { return transposed(key_rows(b, j0, cols), cols, d_, 0); }

  /// Whether queries [i0, i0 + rows) take their scores from the keys as stored (compute given
  /// Transposed::as_stored()): a decode step's few rows, for which transposing a key tile (reading it,
  /// writing it, reading it again) cost more than the product.
  static bool few_queries(std::int64_t rows) { return rows <= kFewRows; }

  /// s's rows [0, rows) = scale q kT over keys [j0, j0 + cols) of batch entry b, read where they
  /// lie in their stored dtype (few_rows_product: one pass over them; a paged cache's tile
  /// gathered first, see contiguous), and zeros up to cols rounded up to tile_gemm_columns(), as
  /// compute's product writes.
  void few_query_scores(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols, float* s, std::int64_t ld) const {
    thread_local std::vector<float> x, out;
    x.resize(static_cast<std::size_t>(rows * d_));
    out.resize(static_cast<std::size_t>(rows * cols));
    const float* q = queries(b, i0, rows);
    for (std::int64_t e = 0; e < rows * d_; ++e) x[static_cast<std::size_t>(e)] = q[e] * a_.scale;
    const ConstView keys = contiguous(a_.k, offset_at(b, batch_, ks_) + j0 * d_, cols * d_, 0);
    few_rows_product(x.data(), rows, d_, cols, stored_at(keys, 0), keys.stored, true, out.data());
    const std::int64_t unit = tile_gemm_columns(), padded = (cols + unit - 1) / unit * unit;
    for (std::int64_t i = 0; i < rows; ++i) {
      std::copy_n(out.data() + i * cols, cols, s + i * ld);
      std::fill(s + i * ld + cols, s + i * ld + padded, 0.0f);
    }
  }

  /// s[i * ld + j] = the score of query i0 + i and key j0 + j (i < rows, j < cols), -inf where
  /// masked; `kt` holds keys [j0, j0 + cols) or more (keys()), and s's columns up to cols rounded
  /// up to tile_gemm_columns() are written (ld must leave room for them). Only the columns that
  /// causality or the window cut are visited for masking, and a tile that a keep-mask along one
  /// axis, or the modifier's masks (ScoreModifier::kept_conditions), provably keep whole is not
  /// masked at all (the modifier's conditions that provably keep it are not evaluated). With a
  /// modifier and `dmod`, dmod (same layout) gets d mod/d score. `known`: masking conditions
  /// already proved to keep the tile (each_slice's), not proved again.
  void compute(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols, const Transposed& kt, float* s,
               std::int64_t ld, float* dmod = nullptr, std::uint32_t known = 0) const {
    if (!kt.is_stored()) {
      const std::int64_t unit = tile_gemm_columns();
      tile_gemm(false, rows, (cols + unit - 1) / unit * unit, d_, a_.scale, queries(b, i0, rows), d_, kt.data, kt.ld, false, s, ld);
    } else {
      few_query_scores(b, i0, rows, j0, cols, s, ld);
    }
    const bool mask_kept = thin_mask_is(true, b, i0, rows, j0, cols);
    const float* mask = a_.mask && !mask_kept ? a_.mask->data + offset_at(b, batch_, ms_) : nullptr;
    thread_local std::vector<std::int64_t> spans;
    const auto [kept, cut, whole] = modifier_masks(b, i0, rows, j0, cols, known, spans);
    if ((mask_kept || whole) && a_.tiles) a_.tiles->unmasked += rows * cols;
    for (std::int64_t i = 0; i < rows; ++i) {
      float* row = s + i * ld;
      float* drow = dmod ? dmod + i * ld : nullptr;
      if (a_.mod) a_.mod->apply_row(b, i0 + i, j0, cols, row, drow, kept | cut);
      if (cut) {  // masked outside [lo, hi): -inf, and a derivative of 0 as the where's
        const std::int64_t lo = spans[static_cast<std::size_t>(2 * i)], hi = spans[static_cast<std::size_t>(2 * i + 1)];
        std::fill(row, row + lo, kNegInf);
        std::fill(row + hi, row + cols, kNegInf);
        if (drow) {
          std::fill(drow, drow + lo, 0.0f);
          std::fill(drow + hi, drow + cols, 0.0f);
        }
      }
      if (mask) {
        const float* mr = mask + (i0 + i) * mask_row_ + j0 * mask_col_;
        for (std::int64_t j = 0; j < cols; ++j) row[j] = mr[j * mask_col_] != 0.0f ? row[j] : kNegInf;
      }
      if (a_.causal) {
        const std::int64_t limit = i0 + i + shift_ - j0;  // keys j <= limit are kept
        for (std::int64_t j = std::max<std::int64_t>(limit + 1, 0); j < cols; ++j) row[j] = kNegInf;
        if (a_.window > 0)  // keys j <= limit - window are outside the window
          for (std::int64_t j = 0; j < std::min<std::int64_t>(limit - a_.window + 1, cols); ++j) row[j] = kNegInf;
      }
    }
  }

  /// The modifier's masking conditions over a tile: `kept`, those provably keeping it (`known`
  /// given, not proved again); `cut`, the diagonal conditions (varlen's causality) it does not
  /// keep whole, at which spans[2 i], spans[2 i + 1] cut row i rather than evaluate them per
  /// score; `whole`, whether those keep every score. With the known ones and the diagonals all,
  /// nothing is left to prove.
  struct ModifierMasks {
    std::uint32_t kept = 0, cut = 0;
    bool whole = false;
  };
  ModifierMasks modifier_masks(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols, std::uint32_t known,
                               std::vector<std::int64_t>& spans) const {
    ModifierMasks m;
    if (!a_.mod) return m;
    const std::uint32_t diagonals = a_.mod->diagonal_conditions();
    const bool ask = !a_.mod->keeps_all(known | diagonals);
    m.kept = ask ? known | a_.mod->kept_conditions(b, i0, rows, j0, cols) : known;
    m.cut = diagonals & ~m.kept;
    if (m.cut) {
      spans.resize(static_cast<std::size_t>(2 * rows));
      if (!a_.mod->diagonal_spans(b, i0, rows, j0, cols, spans.data())) {
        m.cut = 0;  // keys out of order: the conditions evaluated, after all that can be proved
        if (!ask) m.kept = known | a_.mod->kept_conditions(b, i0, rows, j0, cols);
      }
    }
    m.whole = a_.mod->keeps_all(m.kept | m.cut);
    for (std::int64_t i = 0; m.whole && m.cut && i < rows; ++i)
      m.whole = spans[static_cast<std::size_t>(2 * i)] == 0 && spans[static_cast<std::size_t>(2 * i + 1)] == cols;
    return m;
  }

  bool drops() const { return a_.dropout != 0.0; }

  /// Query rows per tile of the backward: kSkippingQueryBlock when a mask or the modifier may
  /// drop whole tiles, kQueryBlock otherwise (the forward and the lse take kQueryBlock and follow
  /// causality's diagonal with each_slice).
  std::int64_t query_block() const { return thin_mask() || (a_.mod && a_.mod->may_mask_tiles()) ? kSkippingQueryBlock : kQueryBlock; }

  /// Adds one task's share of the scores: `total` scores, `computed` of them in tiles computed
  /// (the rest were in tiles skipped as masked).
  void count_tiles(std::int64_t total, std::int64_t computed) const {
    if (!a_.tiles) return;
    a_.tiles->computed += computed;
    a_.tiles->skipped += total - computed;
  }

  /// Batch entry b's runs of packed sequences (one of all its queries and keys when unpacked).
  const Packing& packing(std::int64_t b) const {
    const std::int32_t p = packing_of_.empty() ? -1 : packing_of_[static_cast<std::size_t>(b)];
    return p < 0 ? unpacked_ : packings_[static_cast<std::size_t>(p)];
  }

  /// Every batch entry's query tiles of `block` rows at most, entry by entry: each run of
  /// packed sequences tiled from its first query (Packing).
  Tiles query_tiles(std::int64_t block) const { return tiles(block, n_, &Packing::query_runs, &Packing::query_start); }
  /// Every batch entry's key tiles of kKeyBlock keys at most, likewise.
  Tiles key_tiles() const { return tiles(kKeyBlock, m_, &Packing::key_runs, &Packing::key_start); }

  /// f(j0, cols) for each key tile of queries [i0, i0 + rows) of batch entry b that is not masked
  /// whole: the causal key range and the modifier's tiles skipped when `skip` (the operands the
  /// masked zeros would meet are finite), every key otherwise. Counts the scores; f may return
  /// how many of the tile's it left out itself (each_slice). The queries lie in one run of
  /// packed sequences; the keys of other sequences are left out at once when `skip` (the
  /// document mask drops them), the tiles of each sequence start at its first key.
  template <class F> void each_key_tile(std::int64_t b, std::int64_t i0, std::int64_t rows, bool skip, F f) const {
    each_key_tile(b, i0, rows, skip, 0, m_, f);
  }
  /// The same over keys [lo, hi) only (a split's share of them).
  template <class F> void each_key_tile(std::int64_t b, std::int64_t i0, std::int64_t rows, bool skip, std::int64_t lo, std::int64_t hi, F f) const {
    auto [begin, end] = skip ? keys_for(i0, rows) : std::pair<std::int64_t, std::int64_t>{0, m_};
    if (!may_leave_out(b, 0, begin)) begin = 0;
    if (!may_leave_out(b, end, m_)) end = m_;
    begin = std::max(begin, lo);
    end = std::min(end, hi);
    const Packing& p = packing(b);
    std::int64_t computed = 0;
    auto run = [&](std::int32_t r) {  // key run r's tiles within [begin, end), from its first key
      const std::int64_t first = std::max(p.key_start(r), begin), last = std::min(p.key_start(r + 1), end);
      for (std::int64_t j0 = first; j0 < last; j0 += kKeyBlock) {
        const std::int64_t cols = std::min(kKeyBlock, last - j0);
        if (skip && tile_masked(b, i0, rows, j0, cols) && may_leave_out(b, j0, j0 + cols)) continue;
        computed += rows * cols;
        if constexpr (std::is_void_v<decltype(f(j0, cols))>) f(j0, cols);
        else computed -= f(j0, cols);
      }
    };
    auto others = [&](std::int32_t from, std::int32_t to) {  // key runs [from, to), of other sequences
      const std::int64_t first = std::max(p.key_start(from), begin), last = std::min(p.key_start(to), end);
      if (first >= last || (skip && may_leave_out(b, first, last))) return;
      for (std::int32_t r = from; r < to; ++r) run(r);
    };
    std::int32_t next = 0;
    for (std::int32_t r : p.keys_of(p.query_run(i0))) {
      others(next, r);
      run(r);
      next = r + 1;
    }
    others(next, p.key_runs());
    count_tiles(rows * (hi - lo), computed);
  }

  /// f(r0, r1, k0, width, known) over a key tile [j0, j0 + cols) of queries [i0, i0 + rows) of
  /// batch entry b: rows [r0, r1) and the keys [j0 + k0, j0 + k0 + width) they may keep (k0 a
  /// multiple of kSliceKeys), with `known` the modifier's masking conditions proved to keep all
  /// of them (for compute). The whole tile at once,
  /// unless `skip` holds and a mask boundary crosses it: then slices of kDiagonalSlice rows,
  /// each over the keys it may keep (a slice keeping none is left out). Causality's diagonal
  /// gives each slice the keys up to its last row's; a modifier whose only masking conditions
  /// the tile does not keep are diagonals (varlen's causality) gives each slice its rows' spans
  /// (ScoreModifier::diagonal_spans); another masking modifier gives the span between the first
  /// and the last chunk of kSliceKeys keys that masks_tile cannot prove masked for the slice
  /// (document boundaries, causality written as a mask_mod). Returns the scores left out, for
  /// each_key_tile's count.
  template <class F>
  std::int64_t each_slice(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols, bool skip, F f) const {
    auto kept = [&](std::int64_t r) { return std::clamp<std::int64_t>(i0 + r + shift_ - j0 + 1, 0, cols); };  // keys row r keeps
    const bool diagonal = skip && a_.causal && kept(0) < cols;
    const bool boundary = skip && !a_.causal && a_.mod && a_.mod->may_mask_within(b, i0, rows, j0, cols);
    if ((!diagonal && !boundary) || !may_leave_out(b, j0, j0 + cols)) {
      f(0, rows, std::int64_t{0}, cols, 0u);
      return 0;
    }
    // The tile's rows cut at the diagonal conditions, where the others keep it whole.
    thread_local std::vector<std::int64_t> spans;
    std::uint32_t known = 0;
    bool cut = false;
    if (boundary && a_.mod->diagonal_conditions()) {
      known = a_.mod->kept_conditions(b, i0, rows, j0, cols);
      spans.resize(static_cast<std::size_t>(2 * rows));
      cut = a_.mod->keeps_all(known | a_.mod->diagonal_conditions()) && a_.mod->diagonal_spans(b, i0, rows, j0, cols, spans.data());
    }
    std::int64_t left_out = 0;
    for (std::int64_t r0 = 0; r0 < rows; r0 += kDiagonalSlice) {
      const std::int64_t r1 = std::min(rows, r0 + kDiagonalSlice);
      std::int64_t k0 = 0, k1 = kept(r1 - 1);
      if (cut) {
        std::tie(k0, k1) = span_keys(spans, r0, r1, cols);
      } else if (boundary) {  // chunks [lo, hi) of kSliceKeys keys, the masked ones at either end dropped
        std::int64_t lo = 0, hi = (cols + kSliceKeys - 1) / kSliceKeys;
        auto masked = [&](std::int64_t c) {
          return a_.mod->masks_tile(b, i0 + r0, r1 - r0, j0 + c * kSliceKeys, std::min(kSliceKeys, cols - c * kSliceKeys));
        };
        while (hi > lo && masked(hi - 1)) --hi;
        while (lo < hi && masked(lo)) ++lo;
        k0 = lo * kSliceKeys;
        k1 = std::max(k0, std::min(cols, hi * kSliceKeys));
      }
      left_out += (r1 - r0) * (cols - (k1 - k0));
      if (k1 > k0) f(r0, r1, k0, k1 - k0, known);
    }
    return left_out;
  }

  /// The keys [k0, k1) of a tile of `cols` that rows [r0, r1) keep by their spans (spans[2 r],
  /// spans[2 r + 1]), from the first any keeps, down to a multiple of kSliceKeys, to the last;
  /// [0, 0) when they keep none.
  static std::pair<std::int64_t, std::int64_t> span_keys(const std::vector<std::int64_t>& spans, std::int64_t r0, std::int64_t r1,
                                                         std::int64_t cols) {
    std::int64_t k0 = cols, k1 = 0;
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t lo = spans[static_cast<std::size_t>(2 * r)], hi = spans[static_cast<std::size_t>(2 * r + 1)];
      if (lo >= hi) continue;
      k0 = std::min(k0, lo);
      k1 = std::max(k1, hi);
    }
    if (k1 <= k0) return {0, 0};
    return {k0 / kSliceKeys * kSliceKeys, k1};
  }

  /// f(i0, rows) for each query tile of keys [j0, j0 + cols), likewise (the keys in one run,
  /// the queries of other sequences left out at once when `skip`).
  template <class F> void each_query_tile(std::int64_t b, std::int64_t j0, std::int64_t cols, bool skip, F f) const {
    const auto [begin, end] = skip ? queries_for(j0, cols) : std::pair<std::int64_t, std::int64_t>{0, n_};
    const std::int64_t qb = query_block();
    const Packing& p = packing(b);
    std::int64_t computed = 0;
    auto run = [&](std::int32_t r) {  // query run r's tiles within [begin, end), from its first query
      const std::int64_t first = std::max(p.query_start(r), begin), last = std::min(p.query_start(r + 1), end);
      for (std::int64_t i0 = first; i0 < last; i0 += qb) {
        const std::int64_t rows = std::min(qb, last - i0);
        if (skip && tile_masked(b, i0, rows, j0, cols)) continue;
        computed += rows * cols;
        f(i0, rows);
      }
    };
    std::int32_t next = 0;
    auto others = [&](std::int32_t to) {  // query runs [next, to), of other sequences
      if (!skip)
        for (std::int32_t r = next; r < to; ++r) run(r);
    };
    for (std::int32_t r : p.queries_of(p.key_run(j0))) {
      others(r);
      run(r);
      next = r + 1;
    }
    others(p.query_runs());
    count_tiles(cols * n_, computed);
  }

  /// Checks the values of the keys a skip leaves out (the forward's; the backward checks its
  /// operands whole, before it decides to skip).
  void check_values(const FiniteValues* finite) { finite_ = finite; }
  /// Whether keys [j0, j1) of batch entry b may be left out where masked.
  bool may_leave_out(std::int64_t b, std::int64_t j0, std::int64_t j1) const { return j0 >= j1 || !finite_ || finite_->rows(b, j0, j1); }

  /// Whether blocks may be skipped: causality, a keep-mask laid out along the keys or the queries
  /// only (padding), or a modifier that can mask whole tiles.
  bool may_skip() const { return a_.causal || thin_mask() || (a_.mod && a_.mod->may_mask_tiles()); }

  /// Whether a keep-mask that varies along at most one axis keeps (`keeps`) or drops (0) every
  /// score of the tile: it is read once per query or key of the tile, not per score.
  bool thin_mask_is(bool keeps, std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) const {
    if (!thin_mask()) return false;
    const float* mask = a_.mask->data + offset_at(b, batch_, ms_) + i0 * mask_row_ + j0 * mask_col_;
    const std::int64_t count = mask_col_ != 0 ? cols : mask_row_ != 0 ? rows : 1, stride = mask_row_ + mask_col_;
    for (std::int64_t e = 0; e < count; ++e)
      if ((mask[e * stride] != 0.0f) != keeps) return false;
    return true;
  }

  /// Whether the whole tile is masked whatever its scores: by the keep-mask operand (one that
  /// varies along one of the two axes: its values for the tile's keys or queries all 0) or by
  /// the modifier (ScoreModifier::masks_tile).
  bool tile_masked(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) const {
    return thin_mask_is(false, b, i0, rows, j0, cols) || (a_.mod && a_.mod->masks_tile(b, i0, rows, j0, cols));
  }

  /// z[j] = dropout's factor for query i and key j0 + j of batch entry b (j < cols): 0 for a
  /// dropped weight, 1/(1-p) for a kept one; the weights [batch, N, M]'s element index keys it.
  void dropout_factors(std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t cols, float* z) const {
    const auto index = static_cast<std::uint32_t>((b * n_ + i) * m_ + j0);  // wraps as dropout_mask's does
    cpu::dropout_factors(a_.seed, threshold_, keep_, index, z, cols);
  }

  /// The keys [begin, end) that queries [i0, i0 + rows) may keep: all of them unless causal.
  std::pair<std::int64_t, std::int64_t> keys_for(std::int64_t i0, std::int64_t rows) const {
    if (!a_.causal) return {0, m_};
    const std::int64_t end = std::clamp<std::int64_t>(i0 + rows + shift_, 0, m_);
    const std::int64_t begin = a_.window > 0 ? std::clamp<std::int64_t>(i0 + shift_ - a_.window + 1, 0, m_) : 0;
    return {std::min(begin, end), end};
  }

  /// The queries [begin, end) that may keep one of keys [j0, j0 + cols): all unless causal.
  std::pair<std::int64_t, std::int64_t> queries_for(std::int64_t j0, std::int64_t cols) const {
    if (!a_.causal) return {0, n_};
    const std::int64_t begin = std::clamp<std::int64_t>(j0 - shift_, 0, n_);
    const std::int64_t end = a_.window > 0 ? std::clamp<std::int64_t>(j0 + cols - 1 - shift_ + a_.window, 0, n_) : n_;
    return {begin, std::max(begin, end)};
  }

 private:
  const ScoreArgs& a_;
  ir::Shape batch_;
  std::int64_t n_, m_, d_;
  /// A keep-mask that varies along at most one of the scores' two axes: cheap to check per tile.
  bool thin_mask() const { return a_.mask && (mask_row_ == 0 || mask_col_ == 0); }

  Strides qs_, ks_, ms_{};
  std::int64_t mask_row_ = 0, mask_col_ = 0;
  std::int64_t shift_;
  std::uint32_t threshold_ = ir::dropout_threshold(a_.dropout);
  float keep_ = static_cast<float>(ir::dropout_keep_value(a_.dropout));
  const FiniteValues* finite_ = nullptr;
  Packing unpacked_{n_, m_};
  std::vector<Packing> packings_;         // each distinct packing of the batch entries
  std::vector<std::int32_t> packing_of_;  // by batch entry: its packing, or -1 (empty: every entry unpacked)

  Tiles tiles(std::int64_t block, std::int64_t extent, std::int32_t (Packing::*runs)() const,
              std::int64_t (Packing::*start)(std::int32_t) const) const {
    if (packing_of_.empty()) return Tiles(batches(), block, extent);
    std::vector<Tile> list;
    for (std::int64_t b = 0; b < batches(); ++b) {
      const Packing& p = packing(b);
      for (std::int32_t r = 0; r < (p.*runs)(); ++r)
        for (std::int64_t first = (p.*start)(r), end = (p.*start)(r + 1); first < end; first += block)
          list.push_back({b, first, std::min(block, end - first)});
    }
    return Tiles(std::move(list));
  }
};

/// row[j] *= z[j] for j < n: the cpu's own mul row kernel.
void times(float* row, const float* z, std::int64_t n) { binary_row(ir::Op::mul, row, true, z, true, row, n); }

/// This thread's row of dropout factors, kKeyBlock floats.
float* dropout_buffer() {
  thread_local std::vector<float> z(static_cast<std::size_t>(kKeyBlock));
  return z.data();
}

/// p = exp(s - lse) over a row of scores, 0 where s = -inf (a masked key) whatever lse is.
void probabilities(float* row, std::int64_t cols, float lse) {
  if (std::isfinite(lse)) {
    exp_shifted(row, cols, lse);  // exp(-inf - lse) is exactly 0
    return;
  }
  for (std::int64_t j = 0; j < cols; ++j) row[j] = row[j] == kNegInf ? 0.0f : std::exp(row[j] - lse);
}

/// A key tile's keys and values, transposed for the backward's products with kT and vT.
struct KeyTile {
  Transposed keys, values;
};

/// Keys and values [j0, j0 + cols) of batch entry b (its values from element v_at of v).
KeyTile key_tile(const Scores& sc, std::int64_t b, std::int64_t j0, std::int64_t cols, const ConstView& v, std::int64_t v_at, std::int64_t dv) {
  return {sc.keys(b, j0, cols), transposed(f32_rows(v, v_at + j0 * dv, cols, dv, 1), cols, dv, 1)};
}

/// This thread's p and ds tiles, kQueryBlock x kKeyBlock floats each.
std::pair<float*, float*> tile_buffers() {
  thread_local std::vector<float> p(static_cast<std::size_t>(kQueryBlock * kKeyBlock)), ds(p.size());
  return {p.data(), ds.data()};
}

/// This thread's d mod/d score tile, kQueryBlock x kKeyBlock floats.
float* derivative_buffer() {
  thread_local std::vector<float> dmod(static_cast<std::size_t>(kQueryBlock * kKeyBlock));
  return dmod.data();
}

/// One tile of attention's backward, rows [i0, i0 + rows) by keys [j0, j0 + cols) of batch entry
/// b: p = exp(s - lse) into `p` and, when ds is given, ds = p (dy vT - delta) into `ds` (both
/// with row stride kKeyBlock). dy, lse and delta point at row i0; `tile` holds the keys and
/// values [j0, j0 + cols) transposed. With dropout's factors z, p z (dv's weights) and
/// ds = p (z dy vT - delta).
void backward_tile(const Scores& sc, std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols, const KeyTile& tile,
                   const float* dy, std::int64_t dv, const float* lse, const float* delta, float* p, float* ds) {
  float* dmod = ds && sc.has_derivative() ? derivative_buffer() : nullptr;
  sc.compute(b, i0, rows, j0, cols, tile.keys, p, kKeyBlock, dmod);
  if (ds) tile_gemm(false, rows, tile.values.ld, dv, 1.0f, dy, dv, tile.values.data, tile.values.ld, false, ds, kKeyBlock);
  float* z = sc.drops() ? dropout_buffer() : nullptr;
  for (std::int64_t i = 0; i < rows; ++i) {
    float *p_row = p + i * kKeyBlock, *ds_row = ds ? ds + i * kKeyBlock : nullptr;
    probabilities(p_row, cols, lse[i]);
    if (z) {  // dropout's factors z: ds = p (z dy vT - delta), and dv reads p z
      sc.dropout_factors(b, i0 + i, j0, cols, z);
      if (ds) times(ds_row, z, cols);
    }
    if (ds) times_difference(ds_row, p_row, cols, delta[i]);
    if (z) times(p_row, z, cols);
    if (dmod)  // the chain rule through the modifier
      for (std::int64_t j = 0; j < cols; ++j) ds_row[j] *= dmod[i * kKeyBlock + j];
  }
}

/// Whether the backward may skip batch entry b's masked blocks: only while no NaN or inf among
/// q, k, v, dy and delta meets a masked zero (see attention). v, dy and delta point at entry b.
bool backward_may_skip(const Scores& sc, std::int64_t b, const ConstView& v, std::int64_t v_at, std::int64_t dv, const ConstView& dy,
                       const float* delta) {
  const std::int64_t n = sc.n(), m = sc.m();
  return sc.finite_operands(b) && all_finite(v, v_at, m * dv) && all_finite(dy, b * n * dv, n * dv) && all_finite(delta, n);
}

/// o[r, :] += p[r, :] v over `width` value rows from element `at` of v (in its stored dtype, read
/// where they lie, or a paged cache's gathered first), for `rows` rows of weights p (row stride
/// kKeyBlock): a decode step's product.
void few_query_values(const ConstView& v, std::int64_t at, std::int64_t rows, std::int64_t width, std::int64_t dv, const float* p, float* o) {
  thread_local std::vector<float> x, out;
  x.resize(static_cast<std::size_t>(rows * width));
  out.resize(static_cast<std::size_t>(rows * dv));
  for (std::int64_t r = 0; r < rows; ++r) std::copy_n(p + r * kKeyBlock, width, x.data() + r * width);
  const ConstView values = contiguous(v, at, width * dv, 3);
  few_rows_product(x.data(), rows, width, dv, stored_at(values, 0), values.stored, false, out.data());
  for (std::int64_t e = 0; e < rows * dv; ++e) o[e] += out[static_cast<std::size_t>(e)];
}

/// Queries [i0, i0 + rows) of batch entry b against keys [lo, hi): the online softmax's running
/// max `top` and sum `l` per row, and o (rows x dv, f32) the weighted sum of v, scaled relative to
/// the running max (not yet divided by l).
void attend_keys(const AttentionArgs& a, const Scores& sc, const Strides& vs, bool skip, std::int64_t b, std::int64_t i0, std::int64_t rows,
                 std::int64_t lo, std::int64_t hi, float* o, float* top, float* l) {
  thread_local std::vector<float> s_buf;
  const std::int64_t dv = a.out.shape.back(0);
  const std::int64_t v_at = offset_at(b, sc.batch(), vs);
  s_buf.resize(static_cast<std::size_t>(kQueryBlock * kKeyBlock));
  std::fill_n(top, rows, kNegInf);
  std::fill_n(l, rows, 0.0f);
  std::fill_n(o, rows * dv, 0.0f);
  sc.each_key_tile(b, i0, rows, skip, lo, hi, [&](std::int64_t j0, std::int64_t cols) {
    // A decode step's few queries read the keys where they lie (Scores::few_queries).
    const Transposed kt = Scores::few_queries(rows) ? Transposed::as_stored() : sc.keys(b, j0, cols);
    // The tile whole, or in slices along a mask's boundary: rows [r0, r1) over keys
    // [jk, jk + width).
    return sc.each_slice(
        b, i0, rows, j0, cols, skip, [&](std::int64_t r0, std::int64_t r1, std::int64_t k0, std::int64_t width, std::uint32_t known) {
          const std::int64_t jk = j0 + k0;
          float* s = s_buf.data() + r0 * kKeyBlock;
          sc.compute(b, i0 + r0, r1 - r0, jk, width, kt.from(k0), s, kKeyBlock, nullptr, known);
          float maxima[kQueryBlock], sums[kQueryBlock];
          online_softmax_rows(s, kKeyBlock, r1 - r0, width, top + r0, maxima, sums);
          for (std::int64_t i = r0; i < r1; ++i) {
            float& mi = top[i];
            float& li = l[i];
            const float mx = maxima[i - r0];
            if (mx == kNegInf) continue;  // every key so far is masked: nothing to add (the row is zeros)
            // A row's first keys: o is zeros, scaled by nothing.
            const float correction = mi == kNegInf ? 0.0f : std::exp(mi - mx);
            li = li * correction + sums[i - r0];
            if (correction != 1.0f && mi != kNegInf) scale_inplace(o + i * dv, dv, correction);
            mi = mx;
            if (sc.drops()) {  // the sum normalises the undropped weights; v meets the dropped ones
              float* z = dropout_buffer();
              sc.dropout_factors(b, i0 + i, jk, width, z);
              times(s_buf.data() + i * kKeyBlock, z, width);
            }
          }
          if (Scores::few_queries(rows)) {  // the values read where they lie, once
            few_query_values(a.v, v_at + jk * dv, r1 - r0, width, dv, s, o + r0 * dv);
          } else {
            tile_gemm(false, r1 - r0, dv, width, 1.0f, s, kKeyBlock, f32_rows(a.v, v_at + jk * dv, width, dv, 3), dv, true, o + r0 * dv, dv);
          }
        });
  });
}

/// Attention sinks' logits by batch entry and row (ScoreArgs::sink, broadcasting to [..., N, 1]).
class SinkLogits {
 public:
  SinkLogits(const ConstView* sink, const ir::Shape& batch, std::int64_t n) : sink_(sink), batch_(batch) {
    if (!sink_) return;
    QKV_ASSERT(sink_->stored == DType::f32, "the sink logits are read in f32 (widened: not a streamed operand)");
    ir::Shape rows = batch;
    rows.push_back(n);
    rows.push_back(1);
    strides_ = broadcast_strides(sink_->shape, rows);
    row_stride_ = strides_[static_cast<std::size_t>(batch.rank)];
  }
  bool any() const { return sink_ != nullptr; }
  float at(std::int64_t b, std::int64_t i) const { return sink_->data[offset_at(b, batch_, strides_) + i * row_stride_]; }

 private:
  const ConstView* sink_;
  ir::Shape batch_;
  Strides strides_{};
  std::int64_t row_stride_ = 0;
};

/// Folds a row's sink logit s into its softmax: the running max `top` and sum `l` over its keys
/// become those over its keys and the sink; returns the factor the row's o (relative to the old
/// max) is multiplied by. A sink of -inf changes nothing; a NaN or +inf one makes the row NaN,
/// as sink_softmax's meaning does; a row with no key gets l = 1, its weights zeros.
template <class Sum> float fold_sink(float s, float& top, Sum& l) {
  if (s == kNegInf) return 1.0f;
  const float t = std::isnan(s) || std::isnan(top) ? std::numeric_limits<float>::quiet_NaN() : std::max(top, s);
  const float c = top == kNegInf ? 0.0f : std::exp(top - t);
  l = l * c + std::exp(s - t);
  top = t;
  return c;
}

/// Rows [i0, i0 + rows) of batch entry b finished from their running max (`top`), sum and o,
/// with the sinks folded in: o / l (zeros for a query with no key left, l = 0, as softmax
/// defines for a row of -inf) stored in the output's dtype, and m + log(l) where the
/// log-sum-exp is wanted (-inf for a row without keys, NaN where a score was NaN).
void finish_rows(const AttentionArgs& a, const SinkLogits& sinks, std::int64_t b, std::int64_t i0, std::int64_t rows, float* o, float* top,
                 float* l) {
  const std::int64_t n = a.out.shape.back(1), dv = a.out.shape.back(0), o_at = b * n * dv + i0 * dv;
  if (sinks.any())
    for (std::int64_t i = 0; i < rows; ++i)
      if (const float c = fold_sink(sinks.at(b, i0 + i), top[i], l[i]); c != 1.0f) scale_inplace(o + i * dv, dv, c);
  for (std::int64_t i = 0; i < rows; ++i) scale_inplace(o + i * dv, dv, l[i] == 0.0f ? 0.0f : 1.0f / l[i]);
  if (a.out.stored != DType::f32) narrow(o, rows * dv, a.out, o_at);
  if (a.lse)
    for (std::int64_t i = 0; i < rows; ++i) a.lse[b * n + i0 + i] = top[i] == kNegInf ? kNegInf : top[i] + std::log(l[i]);
}

/// The chunks a query tile's keys split into (split-KV, flash-decoding): kSplitKeys keys at a
/// time from each of its sequence's runs of keys, when the sequence has few queries against many
/// keys (key_splits, of its own queries and keys, whatever its tiles) and the other sequences'
/// keys may be left out; none (the tile whole) otherwise. `keys` gets the sequence's keys.
std::vector<std::pair<std::int64_t, std::int64_t>> key_chunks(const Scores& sc, const Tile& t, bool skip, std::int64_t& keys) {
  const Packing& p = sc.packing(t.b);
  const std::int32_t own = p.query_run(t.first);
  const std::span<const std::int32_t> runs = p.keys_of(own);
  keys = 0;
  for (std::int32_t r : runs) keys += p.key_start(r + 1) - p.key_start(r);
  if (key_splits(p.query_start(own + 1) - p.query_start(own), keys) == 1) return {};
  // The other sequences' keys must be left out for the chunks to cover only its own.
  for (std::size_t e = 0, next = 0; e <= runs.size(); ++e) {
    const std::int64_t from = p.key_start(static_cast<std::int32_t>(next)), to = e < runs.size() ? p.key_start(runs[e]) : sc.m();
    if (from < to && !(skip && sc.may_leave_out(t.b, from, to))) return {};
    if (e < runs.size()) next = static_cast<std::size_t>(runs[e]) + 1;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
  for (std::int32_t r : runs)
    for (std::int64_t lo = p.key_start(r), hi = p.key_start(r + 1); lo < hi; lo += kSplitKeys) chunks.emplace_back(lo, std::min(hi, lo + kSplitKeys));
  return chunks;
}

/// `rows` rows merged from `parts` partials of split-KV, each rows x dv of o, then the rows'
/// maxima, then their sums, from `first`: o (relative to the common max), the max and the sum of
/// each row into o, top and l, as the unsplit kernel keeps them.
void merge_partials(const float* first, std::int64_t parts, std::int64_t rows, std::int64_t dv, float* o, float* top, float* l) {
  const std::int64_t part = rows * (dv + 2);
  for (std::int64_t i = 0; i < rows; ++i) {
    // The common max (NaN if any part's is); each part's weight exp(m_s - max), 0 for a part
    // with no key (its o, a sum of zero weights times v, is zeros, or NaN where v held one,
    // which 0 keeps: as the unsplit kernel gives).
    float mx = kNegInf;
    for (std::int64_t s = 0; s < parts; ++s) {
      const float ms = first[s * part + rows * dv + i];
      mx = std::isnan(ms) || std::isnan(mx) ? std::numeric_limits<float>::quiet_NaN() : std::max(mx, ms);
    }
    float* oi = o + i * dv;
    std::fill_n(oi, dv, 0.0f);
    float sum = 0.0f;
    for (std::int64_t s = 0; s < parts; ++s) {
      const float* ps = first + s * part;
      const float ms = ps[rows * dv + i];
      const float w = ms == kNegInf ? 0.0f : std::exp(ms - mx);
      sum += w * ps[rows * dv + rows + i];
      for (std::int64_t d = 0; d < dv; ++d) oi[d] += w * ps[i * dv + d];
    }
    top[i] = mx;
    l[i] = sum;
  }
}

}  // namespace

std::int64_t key_splits(std::int64_t n, std::int64_t m) {
  if (n < 1 || n > kSplitQueries || m <= kSplitKeys) return 1;
  // Read only where a split is possible: a small graph's run asks the environment nothing.
  const char* off = std::getenv("QKV_CPU_SPLIT_KV");  // "0": never, for measuring the split
  if (off && std::string_view(off) == "0") return 1;
  return (m + kSplitKeys - 1) / kSplitKeys;
}

void attention(const AttentionArgs& a) {
  const ir::Shape& os = a.out.shape;
  Scores sc(a.s, batch_of(os));
  const std::int64_t n = sc.n(), dv = os.back(0), m = sc.m();
  const std::int64_t batches = sc.batches();
  const Strides vs = batch_strides(a.v.shape, sc.batch(), m * dv);
  // Masked keys are left out where their values are finite (FiniteValues): a key tile whose
  // values hold a NaN or an infinity is computed, its zero weights meeting them as the meaning does.
  const FiniteValues finite(a.v, sc.batch(), vs, m, dv, batches);
  sc.check_values(&finite);
  const bool skip = sc.may_skip();
  const SinkLogits sinks(a.s.sink, sc.batch(), n);
  // An f16 or bf16 output accumulates in f32 and is rounded once at the end.
  const bool f32_out = a.out.stored == DType::f32;
  // Each query tile's keys [lo, hi): all of them, or, split-KV (flash-decoding) for few queries
  // against many keys, chunks of kSplitKeys keys from each of its sequence's runs of keys, each
  // into its own partial max, sum and o, merged once every chunk is done. The chunks are a
  // function of one sequence's queries and keys alone, never of the batch or the threads.
  struct Work {
    Tile rows;
    std::int64_t lo, hi;
    std::int64_t part;  // its partial's index, or -1: the tile whole, finished at once
  };
  struct Split {
    Tile rows;
    std::int64_t tile, first;                                 // its index among the tiles, its first partial
    std::vector<std::pair<std::int64_t, std::int64_t>> keys;  // its chunks
  };
  const Tiles tiles = sc.query_tiles(kQueryBlock);
  std::vector<Split> splits;
  for (std::int64_t i = 0; i < tiles.size(); ++i) {
    std::int64_t keys = 0;
    std::vector<std::pair<std::int64_t, std::int64_t>> chunks = key_chunks(sc, tiles[i], skip, keys);
    if (chunks.empty()) continue;
    splits.push_back({tiles[i], i, 0, std::move(chunks)});
    sc.count_tiles(tiles[i].count * (m - keys), 0);  // the other sequences' keys, which no chunk visits
  }
  // A tile whole: its rows over every key, finished at once.
  auto whole = [&](const Tile& t) {
    thread_local std::vector<float> m_buf, l_buf, o_buf;
    const std::int64_t b = t.b, i0 = t.first, rows = t.count;
    if (!f32_out) o_buf.resize(static_cast<std::size_t>(rows * dv));
    m_buf.resize(static_cast<std::size_t>(rows));
    l_buf.resize(static_cast<std::size_t>(rows));
    float* o = f32_out ? a.out.data + b * n * dv + i0 * dv : o_buf.data();
    attend_keys(a, sc, vs, skip, b, i0, rows, 0, m, o, m_buf.data(), l_buf.data());
    finish_rows(a, sinks, b, i0, rows, o, m_buf.data(), l_buf.data());
  };
  if (splits.empty()) {  // nothing split: no work list, nothing allocated
    ThreadPool::global().parallel_for(tiles.size(), [&](std::int64_t task) { whole(tiles[task]); });
    return;
  }
  std::vector<Work> work;
  for (std::int64_t i = 0, e = 0; i < tiles.size(); ++i) {  // the tiles whole first
    if (e < static_cast<std::int64_t>(splits.size()) && splits[static_cast<std::size_t>(e)].tile == i) ++e;
    else work.push_back({tiles[i], 0, m, -1});
  }
  // Chunk-major: consecutive tasks take the same keys of consecutive batch entries, so query
  // heads that share a key/value head (grouped-query attention, k and v broadcast) read its
  // chunk while another has it in cache.
  std::int64_t partial_rows = 0;
  for (Split& sp : splits) {
    sp.first = partial_rows;
    partial_rows += static_cast<std::int64_t>(sp.keys.size()) * sp.rows.count;
  }
  for (std::size_t c = 0, more = 1; more; ++c) {
    more = 0;
    for (const Split& sp : splits)
      if (c < sp.keys.size()) {
        const auto [lo, hi] = sp.keys[c];
        work.push_back({sp.rows, lo, hi, sp.first + static_cast<std::int64_t>(c) * sp.rows.count});
        more = 1;
      }
  }
  // A partial row is o (Dv floats), then its max and sum.
  const std::unique_ptr<float[]> partials(new float[static_cast<std::size_t>(partial_rows * (dv + 2))]);  // each task writes its own
  ThreadPool::global().parallel_for(static_cast<std::int64_t>(work.size()), [&](std::int64_t task) {
    const Work& w = work[static_cast<std::size_t>(task)];
    if (w.part < 0) return whole(w.rows);
    const std::int64_t rows = w.rows.count;
    float* p = partials.get() + w.part * (dv + 2);
    attend_keys(a, sc, vs, skip, w.rows.b, w.rows.first, rows, w.lo, w.hi, p, p + rows * dv, p + rows * dv + rows);
  });
  ThreadPool::global().parallel_for(static_cast<std::int64_t>(splits.size()), [&](std::int64_t e) {
    const Split& sp = splits[static_cast<std::size_t>(e)];
    const std::int64_t b = sp.rows.b, i0 = sp.rows.first, rows = sp.rows.count;
    thread_local std::vector<float> m_buf, l_buf, o_buf;
    m_buf.resize(static_cast<std::size_t>(rows));
    l_buf.resize(static_cast<std::size_t>(rows));
    if (!f32_out) o_buf.resize(static_cast<std::size_t>(rows * dv));
    float* o = f32_out ? a.out.data + b * n * dv + i0 * dv : o_buf.data();
    merge_partials(partials.get() + sp.first * (dv + 2), static_cast<std::int64_t>(sp.keys.size()), rows, dv, o, m_buf.data(), l_buf.data());
    finish_rows(a, sinks, b, i0, rows, o, m_buf.data(), l_buf.data());
  });
}

void attention_jvp(const AttentionJvpArgs& args) {
  const AttentionArgs& a = args.a;
  Scores sc(a.s, batch_of(args.tangent.shape));
  const std::int64_t n = sc.n(), m = sc.m(), d = sc.d(), dv = args.tangent.shape.back(0), batches = sc.batches();
  // The tangents have their primals' shapes, so their batch strides.
  const Strides qs = batch_strides(a.s.q.shape, sc.batch(), n * d), ks = batch_strides(a.s.k.shape, sc.batch(), m * d);
  const Strides vs = batch_strides(a.v.shape, sc.batch(), m * dv);
  // Masked keys are left out while their values and the values' tangents are finite (their zero
  // weights would meet a NaN or an infinity as the meaning does, see attention).
  const FiniteValues finite(a.v, sc.batch(), vs, m, dv, batches);
  sc.check_values(&finite);
  // A tangent without data is zero: its products are left out (exact: where they would meet a
  // NaN or an infinity in q, k or v, the scores or the output are NaN already, or masked).
  auto zero = [](const ConstView& x) { return !x.data && !x.half && !x.paged; };
  const bool zero_q = zero(args.tq), zero_k = zero(args.tk), zero_v = zero(args.tv);
  const bool skip = sc.may_skip() && (zero_v || all_finite(args.tv, 0, args.tv.shape.numel()));
  const SinkLogits sinks(a.s.sink, sc.batch(), n);
  const std::int64_t unit = tile_gemm_columns();
  const Tiles tiles = sc.query_tiles(kQueryBlock);
  ThreadPool::global().parallel_for(tiles.size(), [&](std::int64_t task) {
    thread_local std::vector<float> sums;  // o and t (rows x dv each), then the max, l and mu per row
    const Tile tile = tiles[task];
    const std::int64_t b = tile.b, i0 = tile.first, rows = tile.count;
    sums.assign(static_cast<std::size_t>(rows * (2 * dv + 3)), 0.0f);
    float *o = sums.data(), *t = o + rows * dv, *top = t + rows * dv, *l = top + rows, *mu = l + rows;
    std::fill_n(top, rows, kNegInf);
    const auto [s, ds] = tile_buffers();
    float* dmod = sc.has_derivative() ? derivative_buffer() : nullptr;
    float* z = sc.drops() ? dropout_buffer() : nullptr;
    const std::int64_t q_at = offset_at(b, sc.batch(), qs) + i0 * d, k_at = offset_at(b, sc.batch(), ks), v_at = offset_at(b, sc.batch(), vs);
    sc.each_key_tile(b, i0, rows, skip, [&](std::int64_t j0, std::int64_t cols) {
      const std::int64_t padded = (cols + unit - 1) / unit * unit;
      const Transposed kt = sc.keys(b, j0, cols);
      sc.compute(b, i0, rows, j0, cols, kt, s, kKeyBlock, dmod);
      // s' = (tq kT + q tkT) * scale, the products of zero tangents left out
      if (!zero_q) tile_gemm(false, rows, padded, d, sc.scale(), f32_rows(args.tq, q_at, rows, d, 5), d, kt.data, kt.ld, false, ds, kKeyBlock);
      if (!zero_k) {
        const Transposed tkt = transposed(f32_rows(args.tk, k_at + j0 * d, cols, d, 6), cols, d, 2);
        tile_gemm(false, rows, padded, d, sc.scale(), sc.queries(b, i0, rows), d, tkt.data, tkt.ld, !zero_q, ds, kKeyBlock);
      }
      if (zero_q && zero_k)
        for (std::int64_t i = 0; i < rows; ++i) std::fill_n(ds + i * kKeyBlock, cols, 0.0f);
      // s = e = exp(s - max), s' = e s' (0 where masked), with each row's sums of both
      float maxima[kQueryBlock], sums_e[kQueryBlock], sums_es[kQueryBlock];
      online_softmax_tangent_rows(s, ds, dmod, kKeyBlock, rows, cols, top, maxima, sums_e, sums_es);
      for (std::int64_t i = 0; i < rows; ++i) {
        const float mx = maxima[i];
        if (mx == kNegInf) continue;  // every key so far is masked: nothing to add (both rows are zeros)
        const float c = top[i] == kNegInf ? 0.0f : std::exp(top[i] - mx);
        l[i] = l[i] * c + sums_e[i];
        if (c != 1.0f) {
          scale_inplace(o + i * dv, dv, c);
          scale_inplace(t + i * dv, dv, c);
          mu[i] *= c;
        }
        top[i] = mx;
        mu[i] += sums_es[i];
        if (z) {  // v and tv meet the dropped weights; l and mu the undropped ones
          sc.dropout_factors(b, i0 + i, j0, cols, z);
          times(s + i * kKeyBlock, z, cols);
          times(ds + i * kKeyBlock, z, cols);
        }
      }
      // o += e z v;  t += (e z s') v + e z tv
      const float* v = f32_rows(a.v, v_at + j0 * dv, cols, dv, 3);
      tile_gemm(false, rows, dv, cols, 1.0f, s, kKeyBlock, v, dv, true, o, dv);
      if (!zero_q || !zero_k) tile_gemm(false, rows, dv, cols, 1.0f, ds, kKeyBlock, v, dv, true, t, dv);
      if (!zero_v) tile_gemm(false, rows, dv, cols, 1.0f, s, kKeyBlock, f32_rows(args.tv, v_at + j0 * dv, cols, dv, 7), dv, true, t, dv);
    });
    if (sinks.any())  // the sink joins l (relative to the new max); it has no value and no tangent
      for (std::int64_t i = 0; i < rows; ++i)
        if (const float c = fold_sink(sinks.at(b, i0 + i), top[i], l[i]); c != 1.0f) {
          scale_inplace(o + i * dv, dv, c);
          scale_inplace(t + i * dv, dv, c);
          mu[i] *= c;
        }
    // y = o / l;  y' = t / l - (mu / l) y  (zeros for a row with no key, l = 0)
    for (std::int64_t i = 0; i < rows; ++i) {
      const float inv = l[i] == 0.0f ? 0.0f : 1.0f / l[i], mean = mu[i] * inv;
      float *oi = o + i * dv, *ti = t + i * dv;
      for (std::int64_t e = 0; e < dv; ++e) {
        oi[e] *= inv;
        ti[e] = ti[e] * inv - mean * oi[e];
      }
    }
    const std::int64_t at = b * n * dv + i0 * dv;
    auto store = [&](const float* x, const View& to) {
      if (to.stored != DType::f32) narrow(x, rows * dv, to, at);
      else if (to.data) std::copy_n(x, rows * dv, to.data + at);
    };
    store(o, a.out);
    store(t, args.tangent);
  });
}

void attention_lse(const ScoreArgs& args, View out) {
  const Scores sc(args, batch_of(out.shape));
  QKV_ASSERT(out.stored == DType::f32, "the log-sum-exp is written in f32");
  const SinkLogits sinks(args.sink, sc.batch(), sc.n());
  const std::int64_t n = sc.n();
  const Tiles tiles = sc.query_tiles(kQueryBlock);
  // Masked keys add exp(-inf) = 0 whatever the operands hold, so skipping their blocks is exact.
  ThreadPool::global().parallel_for(tiles.size(), [&](std::int64_t task) {
    thread_local std::vector<float> mx;
    thread_local std::vector<double> sum;
    float* s = tile_buffers().first;
    const Tile tile = tiles[task];
    const std::int64_t b = tile.b, i0 = tile.first, rows = tile.count;
    float* lse = out.data + b * n + i0;
    mx.assign(static_cast<std::size_t>(rows), kNegInf);
    sum.assign(static_cast<std::size_t>(rows), 0.0);
    sc.each_key_tile(b, i0, rows, true, [&](std::int64_t j0, std::int64_t cols) {
      const Transposed kt = sc.keys(b, j0, cols);
      return sc.each_slice(b, i0, rows, j0, cols, true,
                           [&](std::int64_t r0, std::int64_t r1, std::int64_t k0, std::int64_t width, std::uint32_t known) {
                             sc.compute(b, i0 + r0, r1 - r0, j0 + k0, width, kt.from(k0), s + r0 * kKeyBlock, kKeyBlock, nullptr, known);
                             for (std::int64_t i = r0; i < r1; ++i) {
                               float* row = s + i * kKeyBlock;
                               float& mi = mx[static_cast<std::size_t>(i)];
                               const float m_new = max_of(row, width, mi);
                               if (m_new == kNegInf) continue;
                               double& si = sum[static_cast<std::size_t>(i)];
                               if (mi != kNegInf && m_new != mi) si *= std::exp(static_cast<double>(mi) - m_new);
                               si += exp_shifted_sum(row, width, m_new);
                               mi = m_new;
                             }
                           });
    });
    // lse = m + log(sum): -inf for a row without keys (log 0), NaN where a score was NaN.
    if (sinks.any())
      for (std::int64_t i = 0; i < rows; ++i) fold_sink(sinks.at(b, i0 + i), mx[static_cast<std::size_t>(i)], sum[static_cast<std::size_t>(i)]);
    for (std::int64_t i = 0; i < rows; ++i) {
      const float mi = mx[static_cast<std::size_t>(i)];
      lse[i] = mi == kNegInf ? kNegInf : static_cast<float>(mi + std::log(sum[static_cast<std::size_t>(i)]));
    }
  });
}

void attention_grad(const AttentionGradArgs& a) {
  const Scores sc(a.s, batch_of(a.out.shape));
  QKV_ASSERT(a.lse.stored == DType::f32 && a.delta.stored == DType::f32, "the backward reads f32 statistics");
  const std::int64_t n = sc.n(), m = sc.m(), d = sc.d(), dv = a.v.shape.back(0), batches = sc.batches();
  const Strides vs = batch_strides(a.v.shape, sc.batch(), m * dv);
  auto v_at = [&](std::int64_t b) { return offset_at(b, sc.batch(), vs); };
  // dy, lse and delta have the output's batch dims: contiguous per batch entry. q, k, v and dy
  // may be f16 or bf16, widened tile by tile as they are read (f32_rows).
  auto dy_rows = [&](std::int64_t b, std::int64_t i0, std::int64_t rows) { return f32_rows(a.dy, b * n * dv + i0 * dv, rows, dv, 4); };
  auto row_stat = [&](const ConstView& x, std::int64_t b) { return x.data + b * n; };

  // Skipping masked blocks is exact only while no NaN or inf meets a masked zero (see attention).
  std::vector<std::uint8_t> finite(static_cast<std::size_t>(batches), 1);
  if (sc.may_skip())
    ThreadPool::global().parallel_for(batches, [&](std::int64_t b) {
      finite[static_cast<std::size_t>(b)] = backward_may_skip(sc, b, a.v, v_at(b), dv, a.dy, row_stat(a.delta, b));
    });

  if (a.wrt == 0) {
    // dq: per query block, over its key blocks.
    const Tiles tiles = sc.query_tiles(sc.query_block());
    ThreadPool::global().parallel_for(tiles.size(), [&](std::int64_t task) {
      const auto [p, ds] = tile_buffers();
      const Tile tile = tiles[task];
      const std::int64_t b = tile.b, i0 = tile.first, rows = tile.count;
      const float *lse = row_stat(a.lse, b) + i0, *delta = row_stat(a.delta, b) + i0, *dy = dy_rows(b, i0, rows);
      const std::int64_t dq_at = b * n * d + i0 * d;
      float* dq = accumulator(a.out, dq_at, rows * d, 0);
      sc.each_key_tile(b, i0, rows, finite[static_cast<std::size_t>(b)] != 0, [&](std::int64_t j0, std::int64_t cols) {
        backward_tile(sc, b, i0, rows, j0, cols, key_tile(sc, b, j0, cols, a.v, v_at(b), dv), dy, dv, lse, delta, p, ds);
        tile_gemm(false, rows, d, cols, sc.scale(), ds, kKeyBlock, sc.key_rows(b, j0, cols), d, true, dq, d);
      });
      settle(a.out, dq_at, rows * d, dq);
    });
    return;
  }

  // dk or dv: per key block, over its query blocks.
  const std::int64_t width = a.wrt == 1 ? d : dv;
  const Tiles tiles = sc.key_tiles();
  ThreadPool::global().parallel_for(tiles.size(), [&](std::int64_t task) {
    const auto [p, ds_tile] = tile_buffers();
    const Tile keys = tiles[task];
    const std::int64_t b = keys.b, j0 = keys.first, cols = keys.count;
    const std::int64_t acc_at = b * m * width + j0 * width;
    float* acc = accumulator(a.out, acc_at, cols * width, 0);
    const KeyTile tile = key_tile(sc, b, j0, cols, a.v, v_at(b), dv);
    sc.each_query_tile(b, j0, cols, finite[static_cast<std::size_t>(b)] != 0, [&](std::int64_t i0, std::int64_t rows) {
      const float *lse = row_stat(a.lse, b) + i0, *delta = row_stat(a.delta, b) + i0, *dy = dy_rows(b, i0, rows);
      float* ds = a.wrt == 1 ? ds_tile : nullptr;
      backward_tile(sc, b, i0, rows, j0, cols, tile, dy, dv, lse, delta, p, ds);
      if (a.wrt == 2) {  // dv += pT dy
        tile_gemm(true, cols, dv, rows, 1.0f, p, kKeyBlock, dy, dv, true, acc, dv);
        return;
      }
      // dk += dsT q * scale
      tile_gemm(true, cols, d, rows, sc.scale(), ds, kKeyBlock, sc.queries(b, i0, rows), d, true, acc, d);
    });
    settle(a.out, acc_at, cols * width, acc);
  });
}

void attention_grads(const AttentionGradArgs& a, const View* dq, const View* dk, const View* dv) {
  const Scores sc(a.s, batch_of(a.dy.shape));
  QKV_ASSERT(a.lse.stored == DType::f32 && a.delta.stored == DType::f32, "the backward reads f32 statistics");
  const std::int64_t n = sc.n(), m = sc.m(), d = sc.d(), dvw = a.v.shape.back(0);
  const Strides vs = batch_strides(a.v.shape, sc.batch(), m * dvw);
  ThreadPool::global().parallel_for(sc.batches(), [&](std::int64_t b) {
    const auto [p, ds_tile] = tile_buffers();
    const std::int64_t v_at = offset_at(b, sc.batch(), vs);
    const float *lse_b = a.lse.data + b * n, *delta_b = a.delta.data + b * n;
    float* dq_b = dq ? accumulator(*dq, b * n * d, n * d, 0) : nullptr;
    float* dk_b = dk ? accumulator(*dk, b * m * d, m * d, 1) : nullptr;
    float* dv_b = dv ? accumulator(*dv, b * m * dvw, m * dvw, 2) : nullptr;
    // Skipping masked blocks is exact only while no NaN or inf meets a masked zero (see attention).
    const bool skip = !sc.may_skip() || backward_may_skip(sc, b, a.v, v_at, dvw, a.dy, delta_b);
    const Packing& runs = sc.packing(b);  // key tiles from each run's first key
    for (std::int32_t r = 0; r < runs.key_runs(); ++r)
      for (std::int64_t j0 = runs.key_start(r), end = runs.key_start(r + 1); j0 < end; j0 += kKeyBlock) {
        const std::int64_t cols = std::min(kKeyBlock, end - j0);
        const KeyTile tile = key_tile(sc, b, j0, cols, a.v, v_at, dvw);
        sc.each_query_tile(b, j0, cols, skip, [&](std::int64_t i0, std::int64_t rows) {
          const float* dy = f32_rows(a.dy, b * n * dvw + i0 * dvw, rows, dvw, 4);  // q, k, v and dy may be f16 or bf16: widened per tile
          float* ds = dq_b || dk_b ? ds_tile : nullptr;
          backward_tile(sc, b, i0, rows, j0, cols, tile, dy, dvw, lse_b + i0, delta_b + i0, p, ds);
          if (dv_b) tile_gemm(true, cols, dvw, rows, 1.0f, p, kKeyBlock, dy, dvw, true, dv_b + j0 * dvw, dvw);  // dv += pT dy
          if (!ds) return;
          // dk += dsT q * scale; dq += ds k * scale
          if (dk_b) tile_gemm(true, cols, d, rows, sc.scale(), ds, kKeyBlock, sc.queries(b, i0, rows), d, true, dk_b + j0 * d, d);
          if (dq_b) tile_gemm(false, rows, d, cols, sc.scale(), ds, kKeyBlock, sc.key_rows(b, j0, cols), d, true, dq_b + i0 * d, d);
        });
      }
    if (dq_b) settle(*dq, b * n * d, n * d, dq_b);
    if (dk_b) settle(*dk, b * m * d, m * d, dk_b);
    if (dv_b) settle(*dv, b * m * dvw, m * dvw, dv_b);
  });
}

}  // namespace qkv::backend::cpu
