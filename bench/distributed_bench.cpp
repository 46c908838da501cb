// Distributed benchmarks: ring attention and data-parallel training. Run by bench/distributed_bench.py,
// which starts it alone (the one-process peer, and single-thread calibration for the cost model)
// and under mpirun (the job), and prints the table. Prints one JSON object from rank 0.
//
//   qkv_distributed_bench --seq 4096 --dim 64 --heads 4 --reps 5 --model-ranks 2
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "distributed/ring_attention.hpp"
#include "ir/passes/passes.hpp"
#include "models/models.hpp"
#include "train/init.hpp"
#include "train/trainer.hpp"

namespace {

using namespace qkv;
using Clock = std::chrono::steady_clock;

struct Options {
  std::int64_t seq = 4096, dim = 64, heads = 4;
  int reps = 5, model_ranks = 2, batch = 32;
  std::size_t bucket_bytes = 4096;  // the copy task's gradients (20 KiB) in several buckets
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F> double seconds(F f) {
  const auto t = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Tensor random_tensor(std::vector<std::int64_t> shape, std::uint64_t seed) {
  Tensor t(DType::f32, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

distributed::RingAttentionOptions ring_options(bool causal, distributed::SequenceLayout layout) {
  distributed::RingAttentionOptions o;
  o.causal = causal;
  o.layout = layout;
  return o;
}

/// The slowest rank's value (the job waits for it).
double slowest(distributed::Communicator& c, double x) {
  double m = 0;
  for (const auto& s : c.allgather(std::to_string(x))) m = std::max(m, std::stod(s));
  return m;
}

/// Median seconds of forward and of backward of ring attention over q, k, v [1, H, rows, D] shards.
std::pair<double, double> time_ring(distributed::Communicator& c, backend::Backend& b, distributed::RingAttentionOptions o, std::int64_t rows,
                                    const Options& opt, double* wait_fraction = nullptr, double* hidden_fraction = nullptr) {
  distributed::RingAttention ring(c, b, o);
  const Tensor q = random_tensor({1, opt.heads, rows, opt.dim}, 1 + c.rank()), k = random_tensor({1, opt.heads, rows, opt.dim}, 2 + c.rank());
  const Tensor v = random_tensor({1, opt.heads, rows, opt.dim}, 3 + c.rank()), dy = random_tensor({1, opt.heads, rows, opt.dim}, 4 + c.rank());
  std::vector<double> f, bw;
  double waits = 0, totals = 0;
  int transfers = 0, hidden = 0;
  for (int r = 0; r <= opt.reps; ++r) {  // the first run compiles: not counted
    c.barrier();
    const double tf = seconds([&] { ring.forward(q, k, v); });
    const double wf = ring.stats().wait_seconds;
    const int forward_transfers = ring.stats().transfers, forward_hidden = ring.stats().hidden_transfers;
    c.barrier();
    const double tb = seconds([&] { ring.backward(dy); });
    if (r == 0) continue;
    f.push_back(slowest(c, tf));
    bw.push_back(slowest(c, tb));
    waits += wf + ring.stats().wait_seconds;
    transfers += forward_transfers + ring.stats().transfers;
    hidden += forward_hidden + ring.stats().hidden_transfers;
    totals += tf + tb;
  }
  if (wait_fraction) *wait_fraction = slowest(c, waits / totals);
  // The rank that hid the fewest of its transfers.
  if (hidden_fraction) *hidden_fraction = 1.0 - slowest(c, transfers ? 1.0 - static_cast<double>(hidden) / transfers : 0.0);
  return {median(f), median(bw)};
}

/// Median seconds per step of the copy task's training on `batch` sequences (this rank's shard);
/// with `split`, the data-parallel step's two executables even in a job of one. Data-parallel:
/// the shares of gradient buckets whose reduction started while the backward still ran
/// (`overlapped`) and was complete when it ended (`done`), on the rank with fewest, over the
/// timed steps.
double time_training(distributed::Communicator* c, backend::Backend& b, int batch, const Options& opt, bool split = false,
                     double* overlapped = nullptr, double* done = nullptr) {
  const ir::Graph model = models::copy_task_model();
  const auto params = models::copy_task_params();
  train::Trainer t(model, "loss", params, train::Sgd{.lr = 0.3, .momentum = 0.9}, b,
                   train::initialize(model, params, {train::Init::xavier_uniform}, 1),
                   train::DataParallel{.comm = c, .bucket_bytes = opt.bucket_bytes, .split_when_alone = split});
  const int ranks = c ? c->size() : 1, rank = c ? c->rank() : 0;
  std::vector<double> steps;
  int buckets = 0, started = 0, complete = 0;
  for (int r = 0; r <= 4 * opt.reps; ++r) {
    const auto batch_all = train::shard_batch(models::copy_task_batch(batch, static_cast<std::uint64_t>(r)), rank, ranks);
    if (c) c->barrier();
    const double s = seconds([&] { t.step(batch_all); });
    if (r == 0) continue;
    steps.push_back(c ? slowest(*c, s) : s);
    buckets += t.reduction_stats().buckets;
    started += t.reduction_stats().overlapped;
    complete += t.reduction_stats().done_during_backward;
  }
  auto fewest = [&](double x) { return c ? 1.0 - slowest(*c, 1.0 - x) : x; };
  if (overlapped) *overlapped = fewest(buckets ? static_cast<double>(started) / buckets : 0.0);
  if (done) *done = fewest(buckets ? static_cast<double>(complete) / buckets : 0.0);
  return median(steps);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (a == "--seq") opt.seq = v;
    else if (a == "--dim") opt.dim = v;
    else if (a == "--heads") opt.heads = v;
    else if (a == "--reps") opt.reps = static_cast<int>(v);
    else if (a == "--model-ranks") opt.model_ranks = static_cast<int>(v);
    else if (a == "--batch") opt.batch = static_cast<int>(v);
    else if (a == "--bucket-bytes") opt.bucket_bytes = static_cast<std::size_t>(v);
    else {
      std::fprintf(stderr, "qkv_distributed_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    distributed::Communicator& c = distributed::Communicator::world();
    auto cpu = backend::create("cpu");
    const int P = c.size();
    std::string json = "{\"ranks\": " + std::to_string(P) + ", \"seq\": " + std::to_string(opt.seq) + ", \"dim\": " + std::to_string(opt.dim) +
                       ", \"heads\": " + std::to_string(opt.heads) + ", \"batch\": " + std::to_string(opt.batch);
    auto put = [&](const std::string& k, double x) { json += ", \"" + k + "\": " + std::to_string(x); };
    if (P == 1) {
      // The peer: causal attention over the whole sequence, forward and backward, in one process.
      ir::Graph g;
      const ir::Shape s{1, opt.heads, opt.seq, opt.dim};
      const ir::ValueId q = g.add_input("q", DType::f32, s), k = g.add_input("k", DType::f32, s), v = g.add_input("v", DType::f32, s);
      ir::Attrs a;
      a.scale = 1.0 / std::sqrt(static_cast<double>(opt.dim));
      a.causal = true;
      g.set_output("y", g.add(ir::Op::attention, {q, k, v}, a));
      auto exe = cpu->compile(ir::build_backward(g, {"", {"q", "k", "v"}, {"y"}}));
      const backend::TensorMap in = {{"q", random_tensor({1, opt.heads, opt.seq, opt.dim}, 1)},
                                     {"k", random_tensor({1, opt.heads, opt.seq, opt.dim}, 2)},
                                     {"v", random_tensor({1, opt.heads, opt.seq, opt.dim}, 3)},
                                     {"dy", random_tensor({1, opt.heads, opt.seq, opt.dim}, 4)}};
      std::vector<double> t;
      for (int r = 0; r <= opt.reps; ++r) {
        const double x = seconds([&] { exe->run(in); });
        if (r > 0) t.push_back(x);
      }
      put("attention_seconds", median(t));
      // The cost model's blocks: one chunk of N / (2P) rows against one chunk, whole and causal
      // (a job of one holds one chunk, contiguous).
      const std::int64_t chunk = opt.seq / (2 * opt.model_ranks);
      const auto full = time_ring(c, *cpu, ring_options(false, distributed::SequenceLayout::contiguous), chunk, opt);
      const auto diag = time_ring(c, *cpu, ring_options(true, distributed::SequenceLayout::contiguous), chunk, opt);
      put("block_full_forward", full.first);
      put("block_full_backward", full.second);
      put("block_diag_forward", diag.first);
      put("block_diag_backward", diag.second);
      put("train_step_seconds", time_training(nullptr, *cpu, opt.batch, opt));
      put("train_shard_step_seconds", time_training(&c, *cpu, opt.batch / opt.model_ranks, opt, true));
    } else {
      double wait_fraction = 0, hidden_fraction = 0;
      const auto ring =
          time_ring(c, *cpu, ring_options(true, distributed::SequenceLayout::zigzag), opt.seq / P, opt, &wait_fraction, &hidden_fraction);
      put("ring_forward", ring.first);
      put("ring_backward", ring.second);
      put("ring_wait_fraction", wait_fraction);
      put("ring_hidden_fraction", hidden_fraction);
      // One message of the ring: a block of k and v, sent while the same arrives.
      std::vector<float> block(static_cast<std::size_t>(2 * opt.heads * (opt.seq / P) * opt.dim)), in(block.size());
      std::vector<double> t;
      for (int r = 0; r <= 4 * opt.reps; ++r) {
        c.barrier();
        const double x = seconds([&] { c.sendrecv(block, (c.rank() + 1) % P, in, (c.rank() + P - 1) % P); });
        if (r > 0) t.push_back(slowest(c, x));
      }
      put("message_bytes", static_cast<double>(block.size() * sizeof(float)));
      put("message_seconds", median(t));
      // The data-parallel step's collective: an allreduce of every gradient.
      std::size_t grad_floats = 0;
      for (const auto& [name, param] : train::initialize(models::copy_task_model(), models::copy_task_params(), {train::Init::xavier_uniform}, 1))
        grad_floats += static_cast<std::size_t>(param.numel());
      std::vector<float> grads(grad_floats, 1.0f);
      std::vector<double> ar;
      for (int r = 0; r <= 4 * opt.reps; ++r) {
        c.barrier();
        const double x = seconds([&] { c.allreduce_sum(grads); });
        if (r > 0) ar.push_back(slowest(c, x));
      }
      put("grad_bytes", static_cast<double>(grad_floats * sizeof(float)));
      put("allreduce_seconds", median(ar));
      double overlapped = 0, done = 0;
      put("train_step_seconds", time_training(&c, *cpu, opt.batch, opt, false, &overlapped, &done));
      put("train_overlapped_fraction", overlapped);
      put("train_done_fraction", done);
    }
    if (c.rank() == 0) std::printf("%s}\n", json.c_str());
  } catch (const qkv::Error& e) {
    distributed::Communicator::world().abort(exit_code(e), e.what());
  }
  return 0;
}
