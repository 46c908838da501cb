// The training loop's one step, in one process or data-parallel over the ranks of a job.
#include "train/trainer.hpp"

#include <algorithm>
#include <cstring>

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
ir::Graph update_graph(const ir::Graph& forward, const std::vector<std::string>& params, const Optimizer& optimizer) {
  ir::Graph g;
  g.copy_symbols(forward);
  for (const auto& p : params) {
    const ir::Node& n = input_node(forward, p);
    const ir::Shape shape = n.shape;
    g.add_input(p, n.dtype, shape);
    g.set_output("d_" + p, g.add_input("d_" + p, n.dtype, shape));
  }
  return training_step(g, params, optimizer);
}

std::span<std::byte> bytes_of(Tensor& t) { return {t.raw(), t.nbytes()}; }

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
                 backend::Backend& backend, const backend::TensorMap& initial, const DataParallel& parallel)
    : step_graph_(training_step(ir::build_backward(forward, {loss, params, {}}), params, optimizer)), params_(params), loss_(loss),
      parallel_(parallel) {
  for (const auto& p : params)
    if (!initial.contains(p)) throw ShapeError("trainer: no initial value for parameter '" + p + "'");
  if (parallel_.comm && (parallel_.comm->size() > 1 || parallel_.split_when_alone)) {
    start_data_parallel(forward, optimizer, backend, initial);
    return;
  }
  exe_ = backend.compile(step_graph_);
  backend::TensorMap state = initial_optimizer_state(step_graph_, initial);
  for (const auto& p : params) state.emplace(p, initial.at(p));
  exe_->set_state(state);
}

void Trainer::start_data_parallel(const ir::Graph& forward, const Optimizer& optimizer, backend::Backend& backend,
                                  const backend::TensorMap& initial) {
  dist::Communicator& comm = *parallel_.comm;
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

  exe_ = backend.compile(ir::build_backward(forward, {loss_, params_, {}}));
  exe_->set_state(start);
  const ir::Graph update = update_graph(forward, params_, optimizer);
  update_ = backend.compile(update);
  backend::TensorMap state = initial_optimizer_state(update, start);
  for (auto& [name, t] : start) state.emplace(name, std::move(t));
  update_->set_state(state);
}

double Trainer::step(const backend::TensorMap& batch) {
  if (update_) return data_parallel_step(batch);
  return exe_->run(batch).at(loss_).at(0);
}

double Trainer::data_parallel_step(const backend::TensorMap& batch) {
  dist::Communicator& comm = *parallel_.comm;
  backend::TensorMap out = exe_->run(batch);
  // Buckets from the last parameter back (the order a backward finishes them in), each reduced
  // without blocking while the next is packed.
  struct Bucket {
    std::vector<std::string> names;
    std::vector<float> data;
    dist::Pending pending;
  };
  std::vector<Bucket> buckets(1);
  const std::size_t per_bucket = std::max<std::size_t>(1, parallel_.bucket_bytes / sizeof(float));
  for (auto p = params_.rbegin(); p != params_.rend(); ++p) {
    const Tensor& g = out.at("d_" + *p);
    Bucket& b = buckets.back();
    b.names.push_back(*p);
    b.data.insert(b.data.end(), g.data<float>(), g.data<float>() + g.numel());
    for (Bucket& earlier : buckets) earlier.pending.progress();  // MPI moves them only inside its calls
    if (b.data.size() >= per_bucket) {
      b.pending = comm.start_allreduce_sum(b.data);
      buckets.emplace_back();
    }
  }
  if (!buckets.back().names.empty()) buckets.back().pending = comm.start_allreduce_sum(buckets.back().data);
  double loss = out.at(loss_).at(0);
  comm.allreduce_sum(std::span<double>(&loss, 1));

  const float inv = 1.0f / static_cast<float>(comm.size());
  backend::TensorMap grads;
  for (Bucket& b : buckets) {
    b.pending.wait();
    std::size_t at = 0;
    for (const auto& name : b.names) {
      Tensor g(DType::f32, out.at("d_" + name).shape());
      float* d = g.data<float>();
      for (std::int64_t i = 0; i < g.numel(); ++i) d[i] = b.data[at + static_cast<std::size_t>(i)] * inv;
      at += static_cast<std::size_t>(g.numel());
      grads.emplace("d_" + name, std::move(g));
    }
  }
  update_->run(grads);

  backend::TensorMap state = update_->state(), params;
  for (const auto& p : params_) params.emplace(p, state.at(p));
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
