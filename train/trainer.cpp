// The training loop's one step, in one process or data-parallel over the ranks of a job.
#include "train/trainer.hpp"

#include <algorithm>
#include <cstring>
#include <map>

#include "ir/passes/passes.hpp"

namespace qkv::train {

namespace {

const ir::Node& input_node(const ir::Graph& g, const std::string& name) {
  for (ir::ValueId v : g.inputs())
    if (g.node(v).name == name) return g.node(v);
  throw ShapeError("trainer: the model has no input '" + name + "' to train");
}

/// The optimizer's half of a step, run after the gradients are averaged: the parameters (held)
/// and their gradients "d_<p>" (given each step) in, the updates of the parameters and of the
/// optimizer's state out.
ir::Graph update_graph(const ir::Graph& forward, const std::vector<std::string>& params, const Optimizer& optimizer, const MixedPrecision& mixed) {
  ir::Graph g;
  g.copy_symbols(forward);
  for (const auto& p : params) {
    const ir::Node& n = input_node(forward, p);
    const ir::Shape shape = n.shape;
    g.add_input(p, n.dtype, shape);
    g.set_output("d_" + p, g.add_input("d_" + p, n.dtype, shape));
  }
  return training_step(g, params, optimizer, mixed.scales_loss() ? &mixed.scaling : nullptr);
}

/// The forward and backward of a step: `forward` autocast to mixed precision when asked, its
/// loss scaled when f16 asks for it, differentiated with respect to `params`.
ir::Graph backward_graph(const ir::Graph& forward, const std::string& loss, const std::vector<std::string>& params, const MixedPrecision& mixed) {
  if (mixed.compute == DType::f32) return ir::build_backward(forward, {loss, params, {}});
  for (const auto& p : params)
    if (input_node(forward, p).dtype != DType::f32)
      throw ShapeError("trainer: mixed precision keeps an f32 master copy of each parameter; '" + p + "' is " +
                       std::string(dtype_name(input_node(forward, p).dtype)));
  const ir::Graph cast = ir::autocast(forward, mixed.compute);
  if (!mixed.scales_loss()) return ir::build_backward(cast, {loss, params, {}});
  return ir::build_backward(with_scaled_loss(cast, loss), {kScaledLoss, params, {}});
}

/// The loss scaling's starting state: the initial scale and no good steps yet.
void start_loss_scaling(backend::TensorMap& state, const MixedPrecision& mixed) {
  if (!mixed.scales_loss()) return;
  state.insert_or_assign(kLossScale, Tensor::from<float>({}, {static_cast<float>(mixed.scaling.init_scale)}));
  state.insert_or_assign(kGoodSteps, Tensor::from<float>({}, {0.0f}));
}

std::span<std::byte> bytes_of(Tensor& t) { return {t.raw(), t.nbytes()}; }

/// The buckets of a backward graph's gradients "d_<p>" of parameters `params` (their values): in
/// the order the graph computes them (the last layers' first), cut once a bucket holds
/// `bucket_bytes`.
std::vector<GradientBucket> plan_buckets(const ir::Graph& backward, const backend::TensorMap& params, std::size_t bucket_bytes) {
  std::vector<std::pair<ir::ValueId, std::string>> order;
  for (const auto& [p, value] : params) order.emplace_back(backward.output("d_" + p), p);
  std::sort(order.begin(), order.end());
  const std::size_t per_bucket = std::max<std::size_t>(1, bucket_bytes / sizeof(float));
  std::vector<GradientBucket> buckets;
  for (const auto& [v, p] : order) {
    if (buckets.empty() || buckets.back().floats >= per_bucket) buckets.emplace_back();
    GradientBucket& b = buckets.back();
    b.params.push_back(p);
    b.offsets.push_back(b.floats);
    b.floats += static_cast<std::size_t>(params.at(p).numel());
  }
  return buckets;
}

/// Packs each gradient into its bucket as the backward reports it, and starts a bucket's
/// reduction as soon as all its gradients are in and every earlier bucket has started (so the
/// reductions start in the same order on every rank, whatever order a backend computes in).
/// Between the backward's kernels, MPI gets to move the reductions in flight.
class BucketReducer final : public backend::RunObserver {
 public:
  BucketReducer(distributed::Communicator& comm, const std::vector<GradientBucket>& plan) : comm_(comm), plan_(plan), buckets_(plan.size()) {
    for (std::size_t b = 0; b < plan.size(); ++b) {
      buckets_[b].data.resize(plan[b].floats);
      buckets_[b].missing = plan[b].params.size();
      for (std::size_t i = 0; i < plan[b].params.size(); ++i) where_.emplace("d_" + plan[b].params[i], std::pair{b, i});
    }
  }

  void output_ready(std::string_view name, const Tensor& value) override {
    auto it = where_.find(name);
    if (it == where_.end()) return;  // the loss
    const auto [b, i] = it->second;
    if (value.dtype() != DType::f32) throw ShapeError("data parallel: gradient '" + std::string(name) + "' is " + value.type_string() + ", not f32");
    std::copy_n(value.data<float>(), value.numel(), buckets_[b].data.begin() + static_cast<std::ptrdiff_t>(plan_[b].offsets[i]));
    --buckets_[b].missing;
    while (started_ < buckets_.size() && buckets_[started_].missing == 0) {
      buckets_[started_].pending = comm_.start_allreduce_sum(buckets_[started_].data);
      ++started_;
    }
  }
  void between_kernels() override {
    for (std::size_t b = 0; b < started_; ++b) buckets_[b].pending.progress();  // MPI moves them only inside its calls
    // Called after a kernel's outputs are reported: buckets started before that kernel's report
    // had it to overlap.
    overlapped_ = started_before_;
    started_before_ = started_;
  }

  /// At the end of the backward: what its reductions overlapped.
  Trainer::ReductionStats backward_ended() {
    Trainer::ReductionStats s{.buckets = static_cast<int>(buckets_.size()), .overlapped = static_cast<int>(overlapped_)};
    for (std::size_t b = 0; b < started_; ++b) s.done_during_backward += buckets_[b].pending.done() ? 1 : 0;
    return s;
  }
  /// Waits for every reduction and returns the averaged gradients "d_<p>", shaped as `like`.
  backend::TensorMap averages(const backend::TensorMap& like) {
    if (started_ != buckets_.size()) throw BackendError("data parallel: the backward did not report every gradient");
    const float inv = 1.0f / static_cast<float>(comm_.size());
    backend::TensorMap grads;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b].pending.wait();
      for (std::size_t i = 0; i < plan_[b].params.size(); ++i) {
        const std::string name = "d_" + plan_[b].params[i];
        Tensor g = Tensor::uninitialized(DType::f32, like.at(name).shape());
        const float* src = buckets_[b].data.data() + plan_[b].offsets[i];
        std::transform(src, src + g.numel(), g.data<float>(), [inv](float x) { return x * inv; });
        grads.emplace(name, std::move(g));
      }
    }
    return grads;
  }

 private:
  struct Bucket {
    std::vector<float> data;
    std::size_t missing = 0;  // gradients not yet reported
    distributed::Pending pending;
  };
  distributed::Communicator& comm_;
  const std::vector<GradientBucket>& plan_;
  std::vector<Bucket> buckets_;
  std::size_t started_ = 0;                                                        // buckets [0, started_) are being reduced
  std::size_t started_before_ = 0;                                                 // ... as of the last call between kernels
  std::size_t overlapped_ = 0;                                                     // buckets started before a kernel that then ran
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> where_;  // gradient: bucket, index
};

}  // namespace

backend::TensorMap shard_batch(const backend::TensorMap& batch, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) throw UsageError("shard_batch: rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  backend::TensorMap r;
  for (const auto& [name, t] : batch) {
    const std::vector<std::int64_t> shape = t.shape();
    if (shape.empty() || shape[0] % ranks != 0)
      throw ShapeError("batch tensor '" + name + "' " + t.type_string() + ": its first dim does not divide into " + std::to_string(ranks) +
                       " equal shards, one per rank");
    std::vector<std::int64_t> part = shape;
    part[0] = shape[0] / ranks;
    Tensor s(t.dtype(), part);
    const std::size_t bytes = s.nbytes();
    if (bytes) std::memcpy(s.raw(), t.raw() + bytes * static_cast<std::size_t>(rank), bytes);
    r.emplace(name, std::move(s));
  }
  return r;
}

Trainer::Trainer(const ir::Graph& forward, const std::string& loss, const std::vector<std::string>& params, const Optimizer& optimizer,
                 backend::Backend& backend, const backend::TensorMap& initial, const DataParallel& parallel, const MixedPrecision& mixed)
    : step_graph_(training_step(backward_graph(forward, loss, params, mixed), params, optimizer, mixed.scales_loss() ? &mixed.scaling : nullptr)),
      mixed_(mixed), params_(params), loss_(loss), parallel_(parallel) {
  if (mixed.compute != DType::f32 && !is_half(mixed.compute))
    throw UsageError("trainer: mixed precision computes in f16 or bf16, not " + std::string(dtype_name(mixed.compute)));
  for (const auto& p : params)
    if (!initial.contains(p)) throw ShapeError("trainer: no initial value for parameter '" + p + "'");
  if (parallel_.comm && (parallel_.comm->size() > 1 || parallel_.split_when_alone)) {
    start_data_parallel(forward, optimizer, backend, initial);
    return;
  }
  exe_ = backend.compile(step_graph_);
  backend::TensorMap state = initial_optimizer_state(step_graph_, initial);
  for (const auto& p : params) state.emplace(p, initial.at(p));
  start_loss_scaling(state, mixed_);
  exe_->set_state(state);
}

void Trainer::start_data_parallel(const ir::Graph& forward, const Optimizer& optimizer, backend::Backend& backend,
                                  const backend::TensorMap& initial) {
  distributed::Communicator& comm = *parallel_.comm;
  // Every rank starts from rank 0's parameters.
  backend::TensorMap start;
  for (const auto& p : params_) {
    Tensor t = initial.at(p);
    if (t.dtype() != DType::f32) throw ShapeError("trainer: parameter '" + p + "' is " + t.type_string() + ", not f32");
    comm.broadcast(bytes_of(t), 0);
    start.emplace(p, std::move(t));
  }
  const std::vector<std::string> backends = comm.allgather(backend.name());
  broadcast_after_update_ = std::any_of(backends.begin(), backends.end(), [&](const std::string& b) { return b != backends.front(); });

  const ir::Graph backward = backward_graph(forward, loss_, params_, mixed_);
  buckets_ = plan_buckets(backward, start, parallel_.bucket_bytes);
  exe_ = backend.compile(backward);
  const ir::Graph update = update_graph(forward, params_, optimizer, mixed_);
  update_ = backend.compile(update);
  backend::TensorMap state = initial_optimizer_state(update, start);
  start_loss_scaling(state, mixed_);
  if (mixed_.scales_loss()) start.emplace(kLossScale, state.at(kLossScale));  // the backward scales the loss by it
  exe_->set_state(start);
  for (auto& [name, t] : start) state.insert_or_assign(name, std::move(t));
  update_->set_state(state);
}

double Trainer::step(const backend::TensorMap& batch) {
  if (update_) return data_parallel_step(batch);
  const backend::TensorMap out = exe_->run(batch);
  last_step_skipped_ = out.contains(kSkipped) && out.at(kSkipped).at(0) != 0;
  return out.at(loss_).at(0);
}

double Trainer::loss_scale() {
  if (!mixed_.scales_loss()) return 1.0;
  return (update_ ? update_->state() : exe_->state()).at(kLossScale).at(0);
}

double Trainer::data_parallel_step(const backend::TensorMap& batch) {
  distributed::Communicator& comm = *parallel_.comm;
  BucketReducer reducer(comm, buckets_);
  const backend::TensorMap out = exe_->run_observed(batch, reducer);
  reduction_stats_ = reducer.backward_ended();
  double loss = out.at(loss_).at(0);
  comm.allreduce_sum(std::span<double>(&loss, 1));
  const backend::TensorMap grads = reducer.averages(out);
  const backend::TensorMap updated = update_->run(grads);
  last_step_skipped_ = updated.contains(kSkipped) && updated.at(kSkipped).at(0) != 0;

  backend::TensorMap state = update_->state(), params;
  for (const auto& p : params_) params.emplace(p, state.at(p));
  if (mixed_.scales_loss()) params.emplace(kLossScale, state.at(kLossScale));  // the next backward's scale
  if (broadcast_after_update_) {
    for (auto& [name, t] : params) comm.broadcast(bytes_of(t), 0);
    for (const auto& [name, t] : params) state.insert_or_assign(name, t);
    update_->set_state(state);
  }
  exe_->set_state(params);
  return loss / comm.size();
}

backend::TensorMap Trainer::parameters() {
  backend::TensorMap all = update_ ? update_->state() : exe_->state(), r;
  for (const auto& p : params_) r.emplace(p, all.at(p));
  return r;
}

}  // namespace qkv::train
