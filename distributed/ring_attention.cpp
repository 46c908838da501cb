// Ring attention: blocks of keys and values travel around the ring of ranks; each rank merges its
// queries' partial results by log-sum-exp, and in the backward the blocks carry their dk, dv home.
#include "distributed/ring_attention.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "backends/kernel_util.hpp"
#include "ir/graph.hpp"
#include "ir/region.hpp"

namespace qkv::distributed {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// The global chunk indices rank `rank` holds, in its order, and how many chunks there are.
std::vector<int> chunks_of(int rank, int ranks, SequenceLayout layout) {
  if (layout == SequenceLayout::contiguous) return {rank};
  return {rank, 2 * ranks - 1 - rank};
}
int chunk_count(int ranks, SequenceLayout layout) { return layout == SequenceLayout::contiguous ? ranks : 2 * ranks; }

/// A tensor [.., rows, cols] seen as `batch` matrices of rows x cols.
struct Rows {
  std::int64_t batch = 1, rows = 0, cols = 0;
};
Rows rows_of(const Tensor& t, const char* what) {
  if (t.rank() < 2 || t.dtype() != DType::f32)
    throw ShapeError(std::string("ring attention: ") + what + " " + t.type_string() + " is not f32 [.., N, D]");
  Rows r;
  for (int i = 0; i + 2 < t.rank(); ++i) r.batch *= t.shape()[static_cast<std::size_t>(i)];
  r.rows = t.shape()[static_cast<std::size_t>(t.rank() - 2)];
  r.cols = t.shape().back();
  return r;
}

std::vector<std::int64_t> with_rows(std::vector<std::int64_t> shape, std::int64_t rows) {
  shape[shape.size() - 2] = rows;
  return shape;
}

/// Rows [begin, begin + count) of every matrix of `src` (`src_rows` rows of `cols` each) into `dst`
/// at row `at` (of `dst_rows`), for `batch` matrices.
void copy_rows(const float* src, std::int64_t src_rows, std::int64_t begin, std::int64_t count, float* dst, std::int64_t dst_rows, std::int64_t at,
               std::int64_t batch, std::int64_t cols, bool accumulate = false) {
  for (std::int64_t b = 0; b < batch; ++b) {
    const float* s = src + (b * src_rows + begin) * cols;
    float* d = dst + (b * dst_rows + at) * cols;
    if (accumulate)
      for (std::int64_t i = 0; i < count * cols; ++i) d[i] += s[i];
    else std::copy(s, s + count * cols, d);
  }
}

/// Chunk `j` (of `chunk` rows) of a shard [.., n, cols] as its own tensor [.., chunk, cols].
Tensor chunk(const float* shard, const std::vector<std::int64_t>& shape, std::int64_t n, std::int64_t chunk_rows, int j) {
  Tensor t = Tensor::uninitialized(DType::f32, with_rows(shape, chunk_rows));
  const std::int64_t cols = shape.back();
  copy_rows(shard, n, j * chunk_rows, chunk_rows, t.data<float>(), chunk_rows, 0, t.numel() / (chunk_rows * cols), cols);
  return t;
}

/// `mod` with the query's and key's positions shifted by two scalar operands, t0 and t1: a block's
/// kernel sees positions within its chunks, the modifier positions in the whole sequence.
std::shared_ptr<const ir::Graph> with_offsets(const ir::Graph& mod) {
  if (ir::region_tensors(mod) != 0)
    throw UnsupportedError(
        "ring attention: a score modifier that reads tensors (their rows would have to travel with the blocks) is not supported yet");
  const DType offsets[] = {DType::f32, DType::f32};
  auto r = std::make_shared<ir::Graph>(ir::make_region(offsets));
  std::vector<ir::ValueId> map(mod.size(), -1);
  for (std::size_t i = 0; i < mod.size(); ++i) {
    const ir::Node& n = mod.nodes()[i];
    std::vector<ir::ValueId> inputs;
    for (ir::ValueId v : n.inputs) inputs.push_back(map[static_cast<std::size_t>(v)]);
    if (i == ir::kRegionScore) map[i] = ir::kRegionScore;
    else if (i == ir::kRegionQIdx) map[i] = r->add(ir::Op::add, {ir::kRegionQIdx, ir::kRegionFixedInputs});
    else if (i == ir::kRegionKvIdx) map[i] = r->add(ir::Op::add, {ir::kRegionKvIdx, ir::kRegionFixedInputs + 1});
    else map[i] = r->add_like(n, std::move(inputs));
  }
  r->set_output("mod", map[static_cast<std::size_t>(mod.output("mod"))]);
  return r;
}

}  // namespace

std::vector<std::int64_t> shard_rows(std::int64_t n, int rank, int ranks, SequenceLayout layout) {
  const int count = chunk_count(ranks, layout);
  if (ranks < 1 || rank < 0 || rank >= ranks) throw UsageError("ring attention: rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  if (n % count != 0)
    throw ShapeError("ring attention: a sequence of " + std::to_string(n) + " rows does not divide into " + std::to_string(count) +
                     " equal chunks (" + (layout == SequenceLayout::zigzag ? "2 per rank, zigzag" : "1 per rank") + ", " + std::to_string(ranks) +
                     " ranks)");
  const std::int64_t c = n / count;
  std::vector<std::int64_t> r;
  for (int j : chunks_of(rank, ranks, layout))
    for (std::int64_t i = 0; i < c; ++i) r.push_back(j * c + i);
  return r;
}

Tensor shard_sequence(const Tensor& t, int rank, int ranks, SequenceLayout layout) {
  const Rows r = rows_of(t, "tensor");
  const std::vector<std::int64_t> rows = shard_rows(r.rows, rank, ranks, layout);
  Tensor s = Tensor::uninitialized(DType::f32, with_rows(t.shape(), static_cast<std::int64_t>(rows.size())));
  for (std::size_t i = 0; i < rows.size(); ++i)
    copy_rows(t.data<float>(), r.rows, rows[i], 1, s.data<float>(), static_cast<std::int64_t>(rows.size()), static_cast<std::int64_t>(i), r.batch,
              r.cols);
  return s;
}

struct RingAttention::Impl {
  Communicator& comm;
  backend::Backend& backend;
  RingAttentionOptions options;
  // Compiled block kernels by (causal diagonal block, direction), for the current chunk shapes.
  std::map<std::pair<bool, bool>, std::unique_ptr<backend::Executable>> kernels;
  std::vector<std::int64_t> q_chunk_shape, k_chunk_shape, v_chunk_shape;
  // Kept by forward for backward.
  Tensor q, k, v, y, lse;
  std::int64_t n = 0, c = 0;  // rows of the shard, of a chunk

  std::shared_ptr<const ir::Graph> region;  // the score modifier over block positions, or null

  Impl(Communicator& cm, backend::Backend& b, RingAttentionOptions o) : comm(cm), backend(b), options(o) {
    if (options.score_mod) region = with_offsets(*options.score_mod);
  }

  static ir::Shape shape_of(const std::vector<std::int64_t>& dims) {
    ir::Shape s;
    for (std::int64_t d : dims) s.push_back(d);
    return s;
  }

  ir::Attrs attrs(bool diagonal, int wrt = 0) const {
    ir::Attrs a;
    a.scale = options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(q_chunk_shape.back()));
    a.causal = diagonal;  // a diagonal block of equal chunks: top-left causal; others are whole
    a.wrt = static_cast<std::int8_t>(wrt);
    return a;
  }

  /// The block kernel: forward (q, k, v) -> (y, lse), or backward (q, k, v, dy, lse, delta) -> (dq, dk, dv).
  backend::Executable& kernel(bool diagonal, bool backward) {
    auto& exe = kernels[{diagonal, backward}];
    if (exe) return *exe;
    ir::Graph g;
    const ir::ValueId q_in = g.add_input("q", DType::f32, shape_of(q_chunk_shape));
    const ir::ValueId k_in = g.add_input("k", DType::f32, shape_of(k_chunk_shape));
    const ir::ValueId v_in = g.add_input("v", DType::f32, shape_of(v_chunk_shape));
    // With a modifier: flex attention, the chunks' first positions as its two scalar operands.
    std::vector<ir::ValueId> offsets;
    if (region) offsets = {g.add_input("q_offset", DType::f32, {}), g.add_input("kv_offset", DType::f32, {})};
    auto node = [&](ir::Op plain, ir::Op flex, std::vector<ir::ValueId> operands, ir::Attrs a) {
      if (!region) return g.add(plain, std::move(operands), a);
      operands.insert(operands.end(), offsets.begin(), offsets.end());
      return g.add(flex, std::move(operands), a, region);
    };
    if (!backward) {
      g.set_output("y", node(ir::Op::attention, ir::Op::flex_attention, {q_in, k_in, v_in}, attrs(diagonal)));
      g.set_output("lse", node(ir::Op::attention_lse, ir::Op::flex_attention_lse, {q_in, k_in}, attrs(diagonal)));
    } else {
      std::vector<std::int64_t> stat = q_chunk_shape;
      stat.back() = 1;
      std::vector<std::int64_t> dy_shape = q_chunk_shape;
      dy_shape.back() = v_chunk_shape.back();
      const ir::ValueId dy = g.add_input("dy", DType::f32, shape_of(dy_shape));
      const ir::ValueId l = g.add_input("lse", DType::f32, shape_of(stat));
      const ir::ValueId delta = g.add_input("delta", DType::f32, shape_of(stat));
      const char* names[] = {"dq", "dk", "dv"};
      for (int wrt = 0; wrt < 3; ++wrt)
        g.set_output(names[wrt], node(ir::Op::attention_grad, ir::Op::flex_attention_grad, {q_in, k_in, v_in, dy, l, delta}, attrs(diagonal, wrt)));
    }
    exe = backend.compile(g);
    return *exe;
  }

  /// The blocks of (query chunk a, key chunk b) to compute: all without a mask; under a causal
  /// mask b < a whole, b == a its causal diagonal, b > a (every key after every query) skipped.
  bool skipped(int a, int b) const { return options.causal && b > a; }
  /// The modifier's operands for query chunk a and key chunk b: their first global positions.
  void add_offsets(backend::TensorMap& in, int a, int b) const {
    if (!region) return;
    in.insert_or_assign("q_offset", Tensor::from<float>({}, std::vector<float>{static_cast<float>(a * c)}));
    in.insert_or_assign("kv_offset", Tensor::from<float>({}, std::vector<float>{static_cast<float>(b * c)}));
  }
  bool diagonal(int a, int b) const { return options.causal && a == b; }

  /// Calls f(a, b) for each pair of this rank's query chunk a and key chunk b of the block that
  /// rank `owner` holds that a mask does not hide entirely, counting blocks and skipped ones.
  template <class F> void for_each_block(const std::vector<int>& mine, int owner, RingAttention::Stats& stats, F f) const {
    const std::vector<int> theirs = chunks_of(owner, comm.size(), options.layout);
    for (std::size_t a = 0; a < mine.size(); ++a)
      for (std::size_t b = 0; b < theirs.size(); ++b) {
        if (skipped(mine[a], theirs[b])) {
          ++stats.skipped;
          continue;
        }
        ++stats.blocks;
        f(static_cast<int>(a), static_cast<int>(b), mine[a], theirs[b]);
      }
  }

  /// A block kernel's q, k, v (and the modifier's offsets): query chunk `q_chunk`, key chunk b of
  /// the travelling block (k then v, `kn` floats of k).
  backend::TensorMap block_inputs(const Tensor& q_chunk, const std::vector<float>& block, std::size_t kn, int b, int global_a, int global_b) const {
    backend::TensorMap in = {{"q", q_chunk}, {"k", chunk(block.data(), k.shape(), n, c, b)}, {"v", chunk(block.data() + kn, v.shape(), n, c, b)}};
    add_offsets(in, global_a, global_b);
    return in;
  }
};

RingAttention::RingAttention(Communicator& comm, backend::Backend& backend, RingAttentionOptions options)
    : impl_(std::make_unique<Impl>(comm, backend, options)) {}
RingAttention::~RingAttention() = default;

void RingAttention::finish(Pending& transfer) {
  if (!transfer.active()) return;
  ++stats_.transfers;
  if (transfer.done()) ++stats_.hidden_transfers;
  const auto wait = Clock::now();
  transfer.wait();
  stats_.wait_seconds += seconds_since(wait);
}

const Tensor& RingAttention::lse() const {
  if (impl_->q.empty()) throw UsageError("ring attention: lse before forward");
  return impl_->lse;
}

namespace {

/// Folds each row's sink into its normalized output and log-sum-exp (`lse` is [.., n, 1], `y`
/// [.., n, dv]): L' = log(e^L + e^s), y scaled by e^(L - L'). A row without keys (L = -inf) keeps
/// its zeros and takes L' = s; a NaN or +inf sink makes its row NaN, as the meaning does.
void fold_sinks(const Tensor& sinks, Tensor& y, Tensor& lse, std::int64_t dv) {
  ir::Shape rows, ss;
  for (std::int64_t d : lse.shape()) rows.push_back(d);
  for (std::int64_t d : sinks.shape()) ss.push_back(d);
  bool fits = ss.rank <= rows.rank;
  for (int i = 0; fits && i < ss.rank; ++i) fits = ss[i] == 1 || ss[i] == rows[i + rows.rank - ss.rank];
  if (sinks.dtype() != DType::f32 || !fits)
    throw ShapeError("ring attention: sinks " + sinks.type_string() + " must be f32 and broadcast to the rows " + lse.type_string());
  const float* sv = sinks.data<float>();
  float* lo = lse.data<float>();
  float* yo = y.data<float>();
  const float inf = std::numeric_limits<float>::infinity();
  backend::OffsetWalker<1> walk{rows, {backend::broadcast_strides(ss, rows)}};
  for (std::int64_t row = 0; row < lse.numel(); ++row, walk.next()) {
    const std::int64_t at = walk.offset[0];
    const float sink = sv[at], l = lo[row];
    if (sink == -inf) continue;
    const float top = std::isnan(sink) || std::isnan(l) ? std::numeric_limits<float>::quiet_NaN() : std::max(l, sink);
    const float folded = top + std::log((l == -inf ? 0.0f : std::exp(l - top)) + std::exp(sink - top));
    const float keys = l == -inf ? (std::isnan(folded) ? folded : 0.0f) : std::exp(l - folded);
    for (std::int64_t j = 0; j < dv; ++j) yo[row * dv + j] *= keys;
    lo[row] = folded;
  }
}

}  // namespace

Tensor RingAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* sinks) {
  Impl& m = *impl_;
  const auto start = Clock::now();
  stats_ = {};
  const Rows rq = rows_of(q, "q"), rk = rows_of(k, "k"), rv = rows_of(v, "v");
  // k and v may have fewer heads than q (grouped-query attention): their batch dims broadcast.
  const auto batch_dims = [](const Tensor& t) { return std::vector<std::int64_t>(t.shape().begin(), t.shape().end() - 2); };
  const auto broadcasts = [&](const Tensor& t) {
    const std::vector<std::int64_t> bq = batch_dims(q), bt = batch_dims(t);
    if (bt.size() != bq.size()) return false;
    for (std::size_t i = 0; i < bq.size(); ++i)
      if (bt[i] != bq[i] && bt[i] != 1) return false;
    return true;
  };
  if (rq.rows != rk.rows || rk.rows != rv.rows || rq.cols != rk.cols || batch_dims(k) != batch_dims(v) || !broadcasts(k))
    throw ShapeError("ring attention: shards q " + q.type_string() + ", k " + k.type_string() + ", v " + v.type_string() +
                     " must have equal rows (N/P each), k and v the same batch dims, broadcasting to q's, and q, k equal D");
  const int P = m.comm.size(), rank = m.comm.rank();
  const std::vector<int> mine = chunks_of(rank, P, m.options.layout);
  const std::int64_t per = static_cast<std::int64_t>(mine.size());
  if (rq.rows % per != 0)
    throw ShapeError("ring attention: a shard of " + std::to_string(rq.rows) + " rows is not " + std::to_string(per) + " equal chunks");
  m.n = rq.rows;
  m.c = rq.rows / per;
  const auto qs = with_rows(q.shape(), m.c), ks = with_rows(k.shape(), m.c), vs = with_rows(v.shape(), m.c);
  if (qs != m.q_chunk_shape || ks != m.k_chunk_shape || vs != m.v_chunk_shape) {
    m.kernels.clear();
    m.q_chunk_shape = qs;
    m.k_chunk_shape = ks;
    m.v_chunk_shape = vs;
  }
  m.q = q;
  m.k = k;
  m.v = v;

  // The travelling block: this rank's k then v, as one buffer.
  const std::size_t kn = static_cast<std::size_t>(k.numel()), vn = static_cast<std::size_t>(v.numel());
  std::vector<float> block(kn + vn), next(kn + vn);
  std::copy(k.data<float>(), k.data<float>() + kn, block.begin());
  std::copy(v.data<float>(), v.data<float>() + vn, block.begin() + static_cast<std::ptrdiff_t>(kn));

  std::vector<std::int64_t> y_shape = q.shape();
  y_shape.back() = rv.cols;
  Tensor y(DType::f32, y_shape);
  std::vector<std::int64_t> stat = q.shape();
  stat.back() = 1;
  Tensor lse(DType::f32, stat);
  std::fill(lse.data<float>(), lse.data<float>() + lse.numel(), -std::numeric_limits<float>::infinity());

  std::vector<Tensor> q_chunks;
  for (int a = 0; a < per; ++a) q_chunks.push_back(chunk(q.data<float>(), q.shape(), m.n, m.c, a));
  const int next_rank = (rank + 1) % P, prev_rank = (rank + P - 1) % P;
  for (int s = 0; s < P; ++s) {
    Pending pending;
    if (s + 1 < P) pending = m.comm.start_sendrecv(block, next_rank, next, prev_rank);
    m.for_each_block(mine, (rank - s + P) % P, stats_, [&](int a, int b, int ga, int gb) {
      const backend::TensorMap out =
          m.kernel(m.diagonal(ga, gb), false).run(m.block_inputs(q_chunks[static_cast<std::size_t>(a)], block, kn, b, ga, gb));
      pending.progress();
      // Merge rows [a c, (a+1) c) by log-sum-exp: L = log(e^l + e^lb), y = e^(l-L) y + e^(lb-L) yb.
      const float* yb = out.at("y").data<float>();
      const float* lb = out.at("lse").data<float>();
      float* yo = y.data<float>();
      float* lo = lse.data<float>();
      for (std::int64_t bt = 0; bt < rq.batch; ++bt)
        for (std::int64_t i = 0; i < m.c; ++i) {
          const std::int64_t row = bt * m.n + a * m.c + i, brow = bt * m.c + i;
          const float l1 = lo[row], l2 = lb[brow];
          if (l2 == -std::numeric_limits<float>::infinity()) continue;  // no key of this block: nothing to add
          const float hi = std::max(l1, l2);
          const float L = hi + std::log(std::exp(l1 - hi) + std::exp(l2 - hi));
          const float w1 = std::exp(l1 - L), w2 = std::exp(l2 - L);
          float* yr = yo + row * rv.cols;
          const float* ybr = yb + brow * rv.cols;
          for (std::int64_t j = 0; j < rv.cols; ++j) yr[j] = w1 * yr[j] + w2 * ybr[j];
          lo[row] = L;
        }
    });
    finish(pending);
    std::swap(block, next);
  }
  if (sinks) fold_sinks(*sinks, y, lse, rv.cols);
  m.y = y;
  m.lse = lse;
  stats_.total_seconds = seconds_since(start);
  return y;
}

RingAttention::Gradients RingAttention::backward(const Tensor& dy) {
  Impl& m = *impl_;
  if (m.q.empty()) throw UsageError("ring attention: backward before forward");
  if (dy.shape() != m.y.shape()) throw ShapeError("ring attention: dy " + dy.type_string() + " is not the output's " + m.y.type_string());
  const auto start = Clock::now();
  stats_ = {};
  const int P = m.comm.size(), rank = m.comm.rank();
  const std::vector<int> mine = chunks_of(rank, P, m.options.layout);
  const std::int64_t per = static_cast<std::int64_t>(mine.size());
  const Rows rq = rows_of(m.q, "q"), rk = rows_of(m.k, "k"), rv = rows_of(m.v, "v");

  // delta = rowsum(dy * y), the softmax's backward statistic.
  Tensor delta(DType::f32, m.lse.shape());
  for (std::int64_t row = 0; row < rq.batch * m.n; ++row) {
    double d = 0;
    for (std::int64_t j = 0; j < rv.cols; ++j) d += static_cast<double>(dy.data<float>()[row * rv.cols + j]) * m.y.data<float>()[row * rv.cols + j];
    delta.data<float>()[row] = static_cast<float>(d);
  }
  std::vector<Tensor> q_chunks, dy_chunks, lse_chunks, delta_chunks;
  for (int a = 0; a < per; ++a) {
    q_chunks.push_back(chunk(m.q.data<float>(), m.q.shape(), m.n, m.c, a));
    dy_chunks.push_back(chunk(dy.data<float>(), dy.shape(), m.n, m.c, a));
    lse_chunks.push_back(chunk(m.lse.data<float>(), m.lse.shape(), m.n, m.c, a));
    delta_chunks.push_back(chunk(delta.data<float>(), delta.shape(), m.n, m.c, a));
  }

  // Two things travel: the blocks of k and v, as in the forward, and one step behind them the dk,
  // dv accumulated for each block so far. Both move while this rank computes: at step s it
  // receives the accumulator of the block it holds (which the previous rank finished at step
  // s - 1) while computing its own contribution into a fresh buffer, then adds the two and sends
  // the sum on during step s + 1. After P steps each accumulator reaches its block's owner.
  // The accumulators have q's batch dims (with fewer k/v heads than q heads, one per query head:
  // the attention op's gradients, which the graph sums over each group).
  const std::size_t kn = static_cast<std::size_t>(m.k.numel()), vn = static_cast<std::size_t>(m.v.numel());
  const std::size_t dkn = static_cast<std::size_t>(rq.batch * m.n * rk.cols), dvn = static_cast<std::size_t>(rq.batch * m.n * rv.cols);
  std::vector<float> block(kn + vn), next(kn + vn), contribution(dkn + dvn), arriving(dkn + dvn), leaving(dkn + dvn);
  std::copy(m.k.data<float>(), m.k.data<float>() + kn, block.begin());
  std::copy(m.v.data<float>(), m.v.data<float>() + vn, block.begin() + static_cast<std::ptrdiff_t>(kn));
  Tensor dq(DType::f32, m.q.shape());
  const int next_rank = (rank + 1) % P, prev_rank = (rank + P - 1) % P;
  for (int s = 0; s < P; ++s) {
    Pending blocks, accumulators;
    if (s + 1 < P) blocks = m.comm.start_sendrecv(block, next_rank, next, prev_rank);
    if (s > 0) accumulators = m.comm.start_sendrecv(leaving, next_rank, arriving, prev_rank);
    std::fill(contribution.begin(), contribution.end(), 0.0f);
    float* dk = contribution.data();
    float* dv = dk + dkn;
    m.for_each_block(mine, (rank - s + P) % P, stats_, [&](int a, int b, int ga, int gb) {
      backend::TensorMap in = m.block_inputs(q_chunks[static_cast<std::size_t>(a)], block, kn, b, ga, gb);
      in.emplace("dy", dy_chunks[static_cast<std::size_t>(a)]);
      in.emplace("lse", lse_chunks[static_cast<std::size_t>(a)]);
      in.emplace("delta", delta_chunks[static_cast<std::size_t>(a)]);
      const backend::TensorMap g = m.kernel(m.diagonal(ga, gb), true).run(in);
      blocks.progress();
      accumulators.progress();
      copy_rows(g.at("dq").data<float>(), m.c, 0, m.c, dq.data<float>(), m.n, a * m.c, rq.batch, rq.cols, true);
      copy_rows(g.at("dk").data<float>(), m.c, 0, m.c, dk, m.n, b * m.c, rq.batch, rk.cols, true);
      copy_rows(g.at("dv").data<float>(), m.c, 0, m.c, dv, m.n, b * m.c, rq.batch, rv.cols, true);
    });
    finish(accumulators);
    finish(blocks);
    // The accumulator of the block held at this step: what arrived (nothing at step 0) plus this
    // rank's contribution; sent on at the next step.
    for (std::size_t i = 0; i < contribution.size(); ++i) leaving[i] = (s > 0 ? arriving[i] : 0.0f) + contribution[i];
    std::swap(block, next);
  }
  // The last accumulators go to their owners, with no compute left to hide behind.
  const auto wait = Clock::now();
  m.comm.sendrecv(leaving, next_rank, arriving, prev_rank);
  stats_.wait_seconds += seconds_since(wait);
  stats_.transfers += P > 1;
  std::vector<std::int64_t> dk_shape = m.q.shape(), dv_shape = m.q.shape();
  dk_shape.back() = rk.cols;
  dv_shape.back() = rv.cols;
  Gradients r{dq, Tensor(DType::f32, dk_shape), Tensor(DType::f32, dv_shape)};
  std::copy(arriving.begin(), arriving.begin() + static_cast<std::ptrdiff_t>(dkn), r.dk.data<float>());
  std::copy(arriving.begin() + static_cast<std::ptrdiff_t>(dkn), arriving.end(), r.dv.data<float>());
  stats_.total_seconds = seconds_since(start);
  return r;
}

}  // namespace qkv::distributed
