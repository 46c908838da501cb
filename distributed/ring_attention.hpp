// Ring attention (sequence parallel; Liu et al., "Ring Attention with Blockwise Transformers"):
// q, k and v sharded along the sequence over the ranks of a job. Each rank computes its queries
// against the key/value block it holds while the blocks travel around the ring, and merges the
// partial results by their log-sum-exp (the online-softmax merge of the fused kernel). Per-rank
// memory is O(N/P D): no rank ever holds the whole sequence or an N x N score matrix.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backends/backend.hpp"
#include "distributed/communicator.hpp"

namespace qkv::distributed {

/// How a sequence of N rows is laid out over P ranks.
enum class SequenceLayout {
  /// Rank r holds rows [r N/P, (r+1) N/P).
  contiguous,
  /// The sequence in 2P equal chunks; rank r holds chunks r and 2P-1-r, so that under a causal
  /// mask every rank has the same work (each chunk sees the chunks before it).
  zigzag,
};

/// The global row indices this rank holds, in its order (the rows of its shard).
std::vector<std::int64_t> shard_rows(std::int64_t n, int rank, int ranks, SequenceLayout layout);

/// This rank's shard of `t` [.., N, D]: the rows shard_rows gives, along the second-last axis.
/// Throws ShapeError when N does not divide into the layout's chunks.
Tensor shard_sequence(const Tensor& t, int rank, int ranks, SequenceLayout layout);

/// What RingAttention computes, and how the sequence is sharded.
struct RingAttentionOptions {
  double scale = 0;                                ///< the scores' scale; 0: 1/sqrt(D)
  bool causal = false;                             ///< whether future keys are masked
  SequenceLayout layout = SequenceLayout::zigzag;  ///< how the shards were cut (shard_sequence)
  /// A score modifier (ir/region.hpp) of the score and the query's and key's positions, which it
  /// sees as positions in the whole sequence (ALiBi, document masks by position, soft-capping);
  /// null: none. Modifiers that read tensors are not supported yet (UnsupportedError).
  std::shared_ptr<const ir::Graph> score_mod;
};

/// attention(q, k, v) over the whole sequence, each rank holding its shard of q, k, v [.., n, D]
/// (n = N/P rows, batch and head dims in front, k's and v's broadcasting to q's, equal on every
/// rank) and computing on its own backend. Blocks a causal mask hides entirely are skipped.
class RingAttention {
 public:
  /// Ring attention over `comm`'s ranks, each computing on its `backend`; both must outlive it.
  RingAttention(Communicator& comm, backend::Backend& backend, RingAttentionOptions options);
  ~RingAttention();

  /// This rank's rows of the output [.., n, Dv]. Keeps what backward needs (its q, k, v, output
  /// and the rows' log-sum-exp). `sinks`, where given, are attention sinks (gpt-oss): f32 logits
  /// broadcasting to this rank's rows [.., n, 1] (one per head, or this rank's rows of one per
  /// row) that join each row's softmax and take no value; folded into each row once, after the
  /// ring, as the fused kernels fold them after the keys.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* sinks = nullptr);

  /// The last forward's log-sum-exp of each of this rank's rows over the whole sequence [.., n, 1]
  /// (its sinks included, so that backward's weights exclude them).
  const Tensor& lse() const;

  /// dq has q's shape; dk and dv have q's batch dims, as the attention op's gradients: where k
  /// and v have fewer heads than q (grouped-query), one per query head, to be summed per group.
  struct Gradients {
    Tensor dq;  ///< the gradient of this rank's q shard
    Tensor dk;  ///< the gradient of this rank's k shard, per query head
    Tensor dv;  ///< the gradient of this rank's v shard, per query head
  };
  /// The gradients of the last forward's shards from this rank's rows of the output's gradient:
  /// the same ring, with each block's dk and dv travelling with it back to its owner.
  Gradients backward(const Tensor& dy);

  /// Of the last forward or backward: the blocks computed and skipped, and the seconds spent
  /// waiting for blocks that computing did not hide.
  struct Stats {
    int blocks = 0;            ///< block pairs computed
    int skipped = 0;           ///< block pairs a causal mask hid entirely
    int transfers = 0;         ///< messages between ranks
    int hidden_transfers = 0;  ///< of those, complete by the time the compute they overlap ended
    double wait_seconds = 0;   ///< time spent waiting for transfers
    double total_seconds = 0;  ///< the whole call's time
  };
  /// What the last forward or backward did.
  const Stats& stats() const { return stats_; }

 private:
  /// Counts a transfer (hidden when complete as the compute it overlapped ends), then waits.
  void finish(Pending& transfer);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  Stats stats_;
};

}  // namespace qkv::distributed
