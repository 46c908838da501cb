// Training a model on a backend: parameters and optimizer state stay on the backend; each step
// uploads one batch and reads back one number. Data-parallel over the ranks of a job: each rank
// runs its shard of the batch, and the gradients are averaged over the ranks before the update.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "distributed/communicator.hpp"
#include "train/optimizer.hpp"

namespace qkv::train {

/// Data-parallel training (PyTorch's DistributedDataParallel, over MPI): every rank holds the
/// parameters (rank 0's initial values, broadcast), runs forward and backward on its own shard of
/// the batch on its own backend, and averages the gradients over the ranks: in buckets of about
/// `bucket_bytes`, in the order the backward computes them (its last layers' first), each reduced
/// without blocking as soon as its gradients are final, while the backward goes on (on backends
/// that report outputs kernel by kernel, reference and cpu; vulkan's backward is one submission,
/// after which the buckets are reduced while they are packed). Every rank then applies
/// the same update, so the parameters stay the same bits on every rank (when ranks run different
/// backends, whose updates round differently, rank 0's parameters are broadcast after each step).
/// With equal shards and a loss that is a mean over the batch, P ranks with B/P each train as one
/// process with batch B.
struct DataParallel {
  distributed::Communicator* comm = nullptr;        ///< the job; null, or a job of one: not distributed
  std::size_t bucket_bytes = std::size_t{1} << 20;  ///< gradients per reduction message, about
  /// Run the data-parallel step (forward and backward, then the update as a second executable)
  /// even in a job of one: what the distributed benchmark's cost model measures on one process.
  bool split_when_alone = false;
};

/// Mixed-precision training (PyTorch's autocast with GradScaler): the model, written in f32,
/// runs its matmuls and attention in `compute` (f16 or bf16) and its softmaxes, logarithms and
/// sums in f32 (ir::autocast); the parameters stay f32 (the master copy the optimizer updates),
/// cast to `compute` where they are used, so their gradients come back f32 through the casts.
/// For f16, dynamic loss scaling (`scaling`) keeps small gradients from flushing to zero and
/// skips steps whose gradients overflow; bf16 has f32's range and runs without it.
struct MixedPrecision {
  DType compute = DType::f32;  ///< f16 or bf16; f32: off
  bool loss_scaling = true;    ///< whether f16 training scales the loss (bf16 never does)
  LossScaling scaling;         ///< the loss scaling's settings
  /// Whether the loss is scaled: f16 with loss_scaling.
  bool scales_loss() const { return compute == DType::f16 && loss_scaling; }
};

/// Parameters whose gradients are averaged over the ranks as one message. A step's buckets are
/// the same on every rank (collectives start in the same order everywhere): the parameters in
/// the order the backward graph computes their gradients, cut every DataParallel::bucket_bytes.
struct GradientBucket {
  std::vector<std::string> params;   ///< the parameters, in the order their gradients are packed
  std::vector<std::size_t> offsets;  ///< of each parameter's gradient in the message, in floats
  std::size_t floats = 0;            ///< the message's length, in floats
};

/// Rank `rank`'s shard of a batch for a job of `ranks`: every tensor's rows [rank B/P, (rank+1)
/// B/P) along its first dim. Throws ShapeError naming the tensor when B does not divide by P.
backend::TensorMap shard_batch(const backend::TensorMap& batch, int rank, int ranks);

/// Trains a graph's parameters on a backend: one step graph (forward, backward, optimizer
/// updates) whose parameters and optimizer state stay on the backend between steps.
class Trainer {
 public:
  /// `forward` has a scalar output `loss`; `params` name the inputs to train (the others are
  /// data, given to each step); `initial` holds their starting values.
  Trainer(const ir::Graph& forward, const std::string& loss, const std::vector<std::string>& params, const Optimizer& optimizer,
          backend::Backend& backend, const backend::TensorMap& initial, const DataParallel& parallel = {}, const MixedPrecision& mixed = {});

  /// One step on a batch (this rank's shard, when data-parallel): the loss before the update
  /// (averaged over the ranks), then the update, on the backend.
  double step(const backend::TensorMap& batch);
  /// The current parameter values (copied from the backend).
  backend::TensorMap parameters();
  /// The step graph: forward, backward and optimizer updates.
  const ir::Graph& graph() const { return step_graph_; }
  /// The step graph as the backend runs it (fused and lowered for it); when data-parallel, its
  /// forward and backward (the update is a second graph, after the gradients are averaged).
  const ir::Graph& compiled_graph() const { return exe_->graph(); }
  /// Memory the backend planned for one step (activations kept for the backward included).
  std::int64_t planned_bytes() const { return exe_->planned_bytes(); }
  /// Whether steps average gradients over more than one rank.
  bool data_parallel() const { return update_ != nullptr; }
  /// The buckets a data-parallel step reduces, in the order it starts them.
  const std::vector<GradientBucket>& gradient_buckets() const { return buckets_; }

  /// What the last data-parallel step's gradient reductions overlapped.
  struct ReductionStats {
    int buckets = 0;               ///< reductions started
    int overlapped = 0;            ///< reductions started while kernels of the backward were still to run
    int done_during_backward = 0;  ///< reductions complete when the backward ended: wholly hidden
  };
  /// What the last data-parallel step's reductions overlapped (zeros when not data-parallel).
  const ReductionStats& reduction_stats() const { return reduction_stats_; }

  /// With loss scaling: the scale the next step uses, and whether the last step was skipped (its
  /// gradients held an inf or NaN). Without: 1 and false.
  double loss_scale();
  /// Whether the last step was skipped for an inf or NaN gradient (always false without loss scaling).
  bool last_step_skipped() const { return last_step_skipped_; }

 private:
  void start_data_parallel(const ir::Graph& forward, const Optimizer& optimizer, backend::Backend& backend, const backend::TensorMap& initial);
  double data_parallel_step(const backend::TensorMap& batch);

  ir::Graph step_graph_;
  MixedPrecision mixed_;
  bool last_step_skipped_ = false;
  std::vector<std::string> params_;
  std::string loss_;
  std::unique_ptr<backend::Executable> exe_;  // the whole step; data-parallel: forward and backward
  // Data-parallel only: the update of the parameters and optimizer state from averaged gradients.
  DataParallel parallel_;
  std::unique_ptr<backend::Executable> update_;
  bool broadcast_after_update_ = false;  // the ranks' backends differ
  std::vector<GradientBucket> buckets_;
  ReductionStats reduction_stats_;
};

}  // namespace qkv::train
