// Data-parallel training: P ranks with B/P sequences each train as one process with batch B,
// and the parameters stay the same bits on every rank. Trained alone and under mpirun -np 2 and -np 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "models/models.hpp"
#include "tests/support/backend_fixture.hpp"
#include "train/init.hpp"
#include "train/trainer.hpp"

namespace qkv {
namespace {

using distributed::Communicator;

constexpr int kBatch = 8;  // divides by 1, 2 and 4 ranks
constexpr int kSteps = 6;

struct Trained {
  std::vector<double> losses;
  backend::TensorMap params;
};

/// The copy task for kSteps steps: on the whole batch in this process alone (`parallel` empty),
/// or on this rank's shard, data-parallel.
Trained train_copy_task(backend::Backend& b, const train::Optimizer& optimizer, const train::DataParallel& parallel,
                        const train::MixedPrecision& mixed = {}) {
  const ir::Graph model = models::copy_task_model();
  const auto params = models::copy_task_params();
  // Each rank draws its own initial values; data-parallel training starts every rank from rank 0's.
  const int rank = parallel.comm ? parallel.comm->rank() : 0, ranks = parallel.comm ? parallel.comm->size() : 1;
  train::Trainer t(model, "loss", params, optimizer, b,
                   train::initialize(model, params, {train::Init::xavier_uniform}, 5 + static_cast<std::uint64_t>(rank)), parallel, mixed);
  EXPECT_EQ(t.data_parallel(), ranks > 1 || parallel.split_when_alone);
  Trained r;
  for (int s = 0; s < kSteps; ++s) {
    const auto batch = models::copy_task_batch(kBatch, 77 + static_cast<std::uint64_t>(s));
    r.losses.push_back(t.step(train::shard_batch(batch, rank, ranks)));
  }
  r.params = t.parameters();
  return r;
}

/// The largest normwise relative error over the parameters.
double relative_error(const backend::TensorMap& a, const backend::TensorMap& b) {
  double err = 0;
  for (const auto& [name, want] : b) err = std::max(err, testing::normwise_error(a.at(name), want));
  return err;
}

/// How many ranks hold parameters whose bits differ from rank 0's (the same answer on every rank).
int ranks_differing_from_rank0(Communicator& c, backend::TensorMap params) {
  double differs = 0;
  for (auto& [name, t] : params) {
    Tensor mine = t;
    c.broadcast({t.raw(), t.nbytes()}, 0);
    differs = std::max(differs, std::memcmp(mine.raw(), t.raw(), t.nbytes()) != 0 ? 1.0 : 0.0);
  }
  c.allreduce_sum(std::span<double>(&differs, 1));
  return static_cast<int>(differs);
}

void expect_as_one_process(const std::string& backend_name, const train::Optimizer& optimizer, std::size_t bucket_bytes) {
  Communicator& c = Communicator::world();
  auto b = backend::create(backend_name);
  const Trained alone = train_copy_task(*b, optimizer, {});
  const Trained parallel = train_copy_task(*b, optimizer, {.comm = &c, .bucket_bytes = bucket_bytes});
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(parallel.losses[s], alone.losses[s], 1e-5 * std::max(1.0, alone.losses[s])) << "step " << s;
  EXPECT_LE(relative_error(parallel.params, alone.params), 1e-5) << c.describe();
  EXPECT_EQ(ranks_differing_from_rank0(c, parallel.params), 0) << "parameters must stay the same bits on every rank";
}

TEST(DataParallel, SgdOnRanksTrainsAsOneProcessWithTheWholeBatch) { expect_as_one_process("cpu", train::Sgd{.lr = 0.3, .momentum = 0.9}, 1 << 20); }

TEST(DataParallel, AdamWOnRanksTrainsAsOneProcessWithTheWholeBatch) {
  expect_as_one_process("cpu", train::AdamW{.lr = 0.01, .weight_decay = 0.01}, 1 << 20);
}

// Mixed precision (f16 activations and gradients, f32 master parameters, loss scaling) on the
// ranks: each rank's f16 weight gradients round over its shard rather than the whole batch, so
// the runs agree to f16's precision rather than f32's; the parameters stay the same bits on every
// rank.
TEST(DataParallel, MixedPrecisionOnRanksTrainsAsOneProcess) {
  Communicator& c = Communicator::world();
  auto b = backend::create("cpu");
  const train::Sgd sgd{.lr = 0.3, .momentum = 0.9};
  train::MixedPrecision mixed;
  mixed.compute = DType::f16;
  const Trained alone = train_copy_task(*b, sgd, {}, mixed);
  const Trained parallel = train_copy_task(*b, sgd, {.comm = &c, .bucket_bytes = 4096}, mixed);
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(parallel.losses[s], alone.losses[s], 2e-3 * std::max(1.0, alone.losses[s])) << "step " << s;
  EXPECT_LE(relative_error(parallel.params, alone.params), 1e-2) << c.describe();
  EXPECT_EQ(ranks_differing_from_rank0(c, parallel.params), 0) << "parameters must stay the same bits on every rank";
}

// Buckets are reduced separately, and MPI may pick another reduction order for another size: the
// same training within rounding.
TEST(DataParallel, SmallBucketsTrainAsOne) {
  Communicator& c = Communicator::world();
  auto b = backend::create("cpu");
  const train::Sgd sgd{.lr = 0.3, .momentum = 0.9};
  const Trained one = train_copy_task(*b, sgd, {.comm = &c, .bucket_bytes = std::size_t{1} << 30});
  const Trained many = train_copy_task(*b, sgd, {.comm = &c, .bucket_bytes = 64});  // a bucket per tensor, or more
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(many.losses[s], one.losses[s], 1e-6 * std::max(1.0, one.losses[s])) << "step " << s;
  EXPECT_LE(relative_error(many.params, one.params), 1e-6);
  EXPECT_EQ(ranks_differing_from_rank0(c, many.params), 0);
}

// Ranks on different backends (cpu on even ranks; vulkan on odd ones, or reference where there is
// no Vulkan device): their updates round differently, so rank 0's parameters are shared after
// each step, and training still tracks one process.
TEST(DataParallel, RanksOnDifferentBackendsStayInStep) {
  Communicator& c = Communicator::world();
  std::string why;
  const bool vulkan = testing::backend_or_reason("vulkan", why) != nullptr;
  if (!vulkan && testing::vulkan_required()) ADD_FAILURE() << "vulkan: " << why;
  auto cpu = backend::create("cpu");
  auto other = backend::create(vulkan ? "vulkan" : "reference");
  const train::Sgd sgd{.lr = 0.3, .momentum = 0.9};
  const Trained alone = train_copy_task(*cpu, sgd, {});
  const Trained parallel = train_copy_task(c.rank() % 2 ? *other : *cpu, sgd, {.comm = &c});
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(parallel.losses[s], alone.losses[s], 1e-4 * std::max(1.0, alone.losses[s])) << "step " << s;
  EXPECT_LE(relative_error(parallel.params, alone.params), 1e-4) << c.describe();
  EXPECT_EQ(ranks_differing_from_rank0(c, parallel.params), 0);
}

// The data-parallel step (forward and backward, then the update as a second executable) in a
// job of one, as the benchmark's cost model times it: the same training as the fused step.
TEST(DataParallel, TheSplitStepAloneTrainsAsTheFusedStep) {
  Communicator& c = Communicator::world();
  if (c.size() > 1) GTEST_SKIP() << "a job of one (run alone by ctest)";
  auto b = backend::create("cpu");
  const train::Sgd sgd{.lr = 0.3, .momentum = 0.9};
  const Trained fused = train_copy_task(*b, sgd, {});
  const Trained split = train_copy_task(*b, sgd, {.comm = &c, .bucket_bytes = 64, .split_when_alone = true});
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(split.losses[s], fused.losses[s], 1e-6 * std::max(1.0, fused.losses[s])) << "step " << s;
  EXPECT_LE(relative_error(split.params, fused.params), 1e-6);
}

// The buckets follow the backward (the output layer's gradient first), and on backends that run
// kernel by kernel (reference, cpu) each bucket's reduction starts while the backward still has
// kernels to run; vulkan's backward is one submission, so its reductions start when it ends.
TEST(DataParallel, GradientsAreReducedWhileTheBackwardRuns) {
  Communicator& c = Communicator::world();
  const ir::Graph model = models::copy_task_model();
  const auto params = models::copy_task_params();
  const backend::TensorMap initial = train::initialize(model, params, {train::Init::xavier_uniform}, 5);
  const auto batch = train::shard_batch(models::copy_task_batch(kBatch, 77), c.rank(), c.size());
  for (const std::string name : {"reference", "cpu", "vulkan"}) {
    std::string why;
    const auto b = testing::backend_or_reason(name, why);
    if (!b) {
      if (name == "vulkan" && testing::vulkan_required()) ADD_FAILURE() << "vulkan: " << why;
      continue;
    }
    // 64 bytes: a bucket per tensor.
    train::Trainer t(model, "loss", params, train::Sgd{.lr = 0.3}, *b, initial, {.comm = &c, .bucket_bytes = 64, .split_when_alone = true});
    const auto& buckets = t.gradient_buckets();
    ASSERT_EQ(buckets.size(), params.size()) << name;
    EXPECT_EQ(buckets.front().params, std::vector<std::string>{"head"}) << name;
    t.step(batch);
    const auto& stats = t.reduction_stats();
    EXPECT_EQ(stats.buckets, static_cast<int>(params.size())) << name;
    if (name == "vulkan") {
      EXPECT_EQ(stats.overlapped, 0);
    } else {  // all but the last gradients computed have kernels after them
      EXPECT_GE(stats.overlapped, stats.buckets - 2) << name;
      EXPECT_LT(stats.overlapped, stats.buckets) << name;
    }
  }
}

TEST(DataParallel, ShardsAreEqualRowsOfTheBatch) {
  const backend::TensorMap batch = {{"x", Tensor::from<float>({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7})}};
  const backend::TensorMap second = train::shard_batch(batch, 1, 2);
  EXPECT_EQ(second.at("x").shape(), (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(second.at("x").at(0), 4);
  EXPECT_EQ(second.at("x").at(3), 7);
  try {
    train::shard_batch(batch, 0, 3);
    ADD_FAILURE() << "a batch of 4 in 3 shards";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("batch tensor 'x' f32[4,2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(train::shard_batch(batch, 2, 2), UsageError);
}

}  // namespace
}  // namespace qkv
