// The CPU backend's fused attention, forward and backward, without materialising the score
// matrix: softmax(q kT * scale, masked) v, its rows' log-sum-exp, and its gradients.
#pragma once

#include <atomic>

#include "backends/cpu/kernels.hpp"
#include "backends/cpu/score_mod.hpp"

namespace qkv::backend::cpu {

/// The scores every attention kernel computes tile by tile: s = q kT * scale, through flex
/// attention's modifier when there is one, -inf where the keep-mask, causality or the sliding
/// window drops a key. With dropout, the weights are multiplied by dropout_mask's values for the
/// same elements (Philox keyed by the seed and the weights' element index, ir/random.hpp), so
/// the forward, the backward and every backend drop the same weights.
/// Tiles a kernel computed and skipped, counted across its tasks.
struct TileCounter {
  std::atomic<std::int64_t> computed{0}, skipped{0};
  std::atomic<std::int64_t> unmasked{0};  // of the computed, in tiles the masks keep whole (not evaluated)
};

struct ScoreArgs {
  ConstView q, k;         // [..., N, D], [..., M, D]; batch dims broadcast
  const ConstView* mask;  // nullptr, or a 0/1 keep-mask broadcasting to [..., N, M]
  float scale;
  bool causal;
  ir::CausalAlign align;
  std::int64_t window;                 // with causal and > 0: only the last `window` keys (sliding window)
  const ScoreModifier* mod = nullptr;  // flex attention's modifier (with its derivative for the backward)
  double dropout = 0.0;                // flex attention's dropout on the weights (0: none), keyed by `seed`
  std::uint32_t seed = 0;
  TileCounter* tiles = nullptr;     // when given: counts the tiles computed and skipped
  const ConstView* sink = nullptr;  // the forward and lse: sink logits (f32) broadcasting to [..., N, 1] (sink_softmax), or none
};

/// The forward and the log-sum-exp read q, k and v in f32, f16 or bf16 (ConstView::stored),
/// widening tile by tile, and the forward writes its output in any of them (accumulated in f32,
/// rounded once); the backward takes f32 operands.
struct AttentionArgs {
  ScoreArgs s;
  ConstView v;           // [..., M, Dv]
  View out;              // [..., N, Dv]
  float* lse = nullptr;  // when given: [..., N] rows' log-sum-exp, as attention_lse computes
};

/// Query blocks of kQueryBlock rows stream over key blocks of kKeyBlock keys with an online
/// softmax (running max and sum per row), so each thread holds kQueryBlock x (kKeyBlock + Dv)
/// floats whatever N and M are. Key blocks wholly above the causal diagonal, or wholly before a
/// sliding window, are skipped. A row whose keys are all masked gives zeros, as the
/// decomposition does. Few queries against many keys (decoding) are split along the keys
/// (key_splits), the parts merged by their log-sum-exp.
void attention(const AttentionArgs& args);

/// Keys per part when the forward splits them (flash-decoding): two key blocks. A part's keys and
/// values (512 x 128 floats each at head dim 128: 512 KB together) take tens of microseconds to
/// stream; its partial output (a row of Dv floats per query) costs the merge a thousandth of that.
inline constexpr std::int64_t kSplitKeys = 512;
/// Queries up to which the forward splits the keys: a decode step's, a few speculated tokens'.
/// Each part's partial output is N x Dv floats: at 16 queries a thirtieth of the part's keys and
/// values (512 x (D + Dv) 16-bit elements at least), so the partials never outgrow the cache.
inline constexpr std::int64_t kSplitQueries = 16;
/// The parts the forward splits a batch entry's keys into: ceil(M / kSplitKeys) when it has 1 to
/// kSplitQueries queries and M > kSplitKeys, else 1. A function of one batch
/// entry's shape only, never of the batch or the threads, so a sequence's result does not depend
/// on what else is in the batch or on the machine's cores. QKV_CPU_SPLIT_KV=0 turns it off (1
/// part), for measuring what it gains.
std::int64_t key_splits(std::int64_t n, std::int64_t m);

/// out [..., N, 1] = log(sum(exp(s))) over each query's keys (-inf when it has none): one pass of
/// q kT with a running max, skipping masked key blocks like the forward.
void attention_lse(const ScoreArgs& args, View out);

struct AttentionGradArgs {
  ScoreArgs s;
  ConstView v, dy, lse, delta;  // [..., M, Dv], [..., N, Dv], [..., N, 1], [..., N, 1]
  int wrt;                      // 0: dq, 1: dk, 2: dv
  View out;                     // operand wrt's last two dims under the broadcast batch dims
};

/// FlashAttention-2's backward for one operand: p = exp(s - lse) (0 where s is masked) is
/// recomputed tile by tile; dv = pT dy, ds = p (dy vT - delta), dq = ds k * scale,
/// dk = dsT q * scale, ds times d mod/d score under a modifier. dq streams key blocks per query block; dk and dv stream query blocks per
/// key block, so no task writes another's rows. Masked blocks are skipped unless the batch entry
/// holds a NaN or inf (whose products with the masked zeros the meaning keeps). q, k, v and dy
/// may be f16 or bf16 (each tile widened as it is read); so may the output (each task's rows
/// accumulated in f32 and rounded once, where the graph rounds the gradient).
void attention_grad(const AttentionGradArgs& args);

/// dq, dk and dv (each nullptr when not wanted) in one pass per batch entry: each tile's p and ds
/// feed all three, so the scores are computed once instead of three times. A task owns a whole
/// batch entry (its dq rows are written by every key block), so this is the faster choice only
/// when there are at least as many batch entries as threads. `args.out` and `args.wrt` are not read.
/// Like attention_grad's output, each may be f16 or bf16: accumulated in f32, rounded once.
void attention_grads(const AttentionGradArgs& args, const View* dq, const View* dk, const View* dv);

/// Attention's tangent (forward mode) along the tangents tq, tk and tv of q, k and v (each
/// shaped as its primal): the output y (into `a.out`, or nowhere when its data is null) and its
/// tangent y' (into `tangent`) in one streaming pass, O(N D) memory. With the scores' tangent
/// s' = (tq kT + q tkT) * scale (times d mod/d score under a modifier, 0 where masked), each row
/// keeps, beside the online softmax's running max and sum l, the sums (relative to the max)
/// o = sum e z v, t = sum e z (s' v + tv) and mu = sum e s', e = exp(s - max), z dropout's
/// factors; then y = o / l and y' = t / l - (mu / l) y. A sink joins l (it has no tangent). q,
/// k, v and the tangents may be f16 or bf16 (widened tile by tile); y and y' are written in
/// their views' dtypes.
struct AttentionJvpArgs {
  AttentionArgs a;       // a.out.data may be null: y is not wanted (a.lse is not read)
  ConstView tq, tk, tv;  // a view without data (data, half and paged null) is a zero tangent
  View tangent;          // [..., N, Dv]
};
void attention_jvp(const AttentionJvpArgs& args);

/// Query rows per tile: kQueryBlock; the backward takes kSkippingQueryBlock when a keep-mask or
/// a masking modifier may drop whole tiles (narrower tiles follow a document boundary more
/// closely). A tile that causality's diagonal (or a masking modifier's boundary) crosses runs,
/// in the forward and the lse, as slices of kDiagonalSlice rows, each over the keys it may keep,
/// so the masked triangle is mostly not computed. Measured at (4, 8, 512, 64), 2 threads: 256 x 256 tiles ran the plain
/// forward 10% faster than 128 x 256 (AMD Zen 5); with tile_gemm, slices of 16 rows ran causal
/// 1.67-1.72x the plain forward against 1.60-1.66x for 32 (AMD Zen 4), and 256-row tiles ran
/// documents of 128 tokens (a mask_mod) 10% faster than 128-row ones in the forward.
inline constexpr std::int64_t kQueryBlock = 256;
inline constexpr std::int64_t kSkippingQueryBlock = 128;
inline constexpr std::int64_t kKeyBlock = 256;
inline constexpr std::int64_t kDiagonalSlice = 16;
/// Keys per chunk when a slice's keys are bounded by a masking modifier (see each_slice): a
/// multiple of the widest register tile's columns (32), so a slice's keys start on one.
inline constexpr std::int64_t kSliceKeys = 32;

}  // namespace qkv::backend::cpu
