// Optimizers, initialisers and training: the arithmetic against PyTorch's formulas, and the
// copy-task model's losses on cpu and vulkan tracking the reference step by step.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "backends/equivalence.hpp"
#include "backends/reference/reference_backend.hpp"
#include "dsl/dsl.hpp"
#include "io/npy.hpp"
#include "ir/printer.hpp"
#include "models/models.hpp"
#include "tests/support/backend_fixture.hpp"
#include "train/init.hpp"
#include "train/trainer.hpp"

namespace qkv {
namespace {

/// loss = sum(w * w) / 2, so the gradient is w itself.
ir::Graph quadratic() {
  auto w = input<"w">(dim<2>);
  return lower(named<"loss">(sum_all(w * w) * 0.5));
}

class Optimizers : public ::testing::TestWithParam<std::string> {};

TEST_P(Optimizers, SgdWithMomentumAndWeightDecay) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  train::Trainer t(quadratic(), "loss", {"w"}, train::Sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}, *b,
                   {{"w", Tensor::from<float>({2}, {1.0f, -2.0f})}});
  double w = 1.0, v = 0.0;
  for (int s = 0; s < 3; ++s) {
    EXPECT_NEAR(t.step({}), 0.5 * (w * w + 4 * w * w), 1e-5) << s;  // the second entry stays -2 w
    double g = w + 0.01 * w;
    v = 0.9 * v + g;
    w -= 0.1 * v;
  }
  EXPECT_NEAR(t.parameters().at("w").at(0), w, 1e-6);
  EXPECT_NEAR(t.parameters().at("w").at(1), -2 * w, 1e-6);
}

TEST_P(Optimizers, AdamW) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  const train::AdamW o{.lr = 0.05, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1};
  train::Trainer t(quadratic(), "loss", {"w"}, o, *b, {{"w", Tensor::from<float>({2}, {1.0f, -0.5f})}});
  double w = 1.0, m = 0, v = 0;
  for (int s = 1; s <= 4; ++s) {
    t.step({});
    double g = w;
    w *= 1 - o.lr * o.weight_decay;
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    double mhat = m / (1 - std::pow(o.beta1, s)), vhat = v / (1 - std::pow(o.beta2, s));
    w -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
  }
  EXPECT_NEAR(t.parameters().at("w").at(0), w, 1e-5);
}

TEST_P(Optimizers, GradientClippingAsClipGradNorm) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  // Gradient w = (3, -4): norm 5, clipped to 1 (scaled by 1 / (5 + 1e-6)); an SGD step of lr 1
  // moves w by the clipped gradient. A norm under the limit is left alone.
  train::Trainer clipped(quadratic(), "loss", {"w"}, train::Sgd{.lr = 1.0, .max_grad_norm = 1.0}, *b,
                         {{"w", Tensor::from<float>({2}, {3.0f, -4.0f})}});
  clipped.step({});
  const double scale = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(clipped.parameters().at("w").at(0), 3.0 - 3.0 * scale, 1e-6);
  EXPECT_NEAR(clipped.parameters().at("w").at(1), -4.0 + 4.0 * scale, 1e-6);
  train::Trainer loose(quadratic(), "loss", {"w"}, train::AdamW{.lr = 0.1, .weight_decay = 0.0, .max_grad_norm = 10.0}, *b,
                       {{"w", Tensor::from<float>({2}, {3.0f, -4.0f})}});
  loose.step({});
  EXPECT_NEAR(loose.parameters().at("w").at(0), 3.0 - 0.1, 1e-5);  // AdamW's first step: lr * sign(g)
}

INSTANTIATE_TEST_SUITE_P(All, Optimizers, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

TEST(Init, XavierBoundsSeedsAndLoading) {
  Tensor a = train::initialize({64, 32}, {train::Init::xavier_uniform}, 1);
  const double bound = std::sqrt(6.0 / 96.0);
  double lo = 0, hi = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) lo = std::min(lo, a.at(i)), hi = std::max(hi, a.at(i));
  EXPECT_LE(hi, bound);
  EXPECT_GE(lo, -bound);
  EXPECT_GT(hi, 0.9 * bound);
  EXPECT_EQ(train::initialize({64, 32}, {train::Init::xavier_uniform}, 1).at(5), a.at(5));
  EXPECT_NE(train::initialize({64, 32}, {train::Init::xavier_uniform}, 2).at(5), a.at(5));
  Tensor n = train::initialize({4000}, {train::Init::normal, 1.0, 0.5}, 3);
  double mean = 0;
  for (std::int64_t i = 0; i < n.numel(); ++i) mean += n.at(i) / 4000.0;
  EXPECT_NEAR(mean, 1.0, 0.05);

  ir::Graph g = models::copy_task_model();
  auto p = train::initialize(g, models::copy_task_params(), {train::Init::xavier_normal}, 5);
  EXPECT_EQ(p.at("embed").shape(), (std::vector<std::int64_t>{10, 32}));
  auto dir = std::filesystem::temp_directory_path() / "qkv_params_test";
  std::filesystem::create_directories(dir);
  io::write_npy((dir / "head.npy").string(), p.at("head").to(DType::f64));
  EXPECT_EQ(train::load_parameters(g, {"head"}, dir.string()).at("head").at(3), p.at("head").at(3));
  io::write_npy((dir / "head.npy").string(), Tensor(DType::f32, {3, 3}));
  EXPECT_THROW(train::load_parameters(g, {"head"}, dir.string()), ShapeError);
  EXPECT_THROW(train::load_parameters(g, {"pos"}, dir.string()), IoError);
  std::filesystem::remove_all(dir);
}

const train::Optimizer kSgd = train::Sgd{.lr = 0.3, .momentum = 0.9};
const train::Optimizer kAdamW = train::AdamW{.lr = 1e-2, .weight_decay = 0.0};

/// The copy-task losses per step on a backend, from the same initial parameters and batches.
std::vector<double> losses(backend::Backend& b, int steps, const train::Optimizer& optimizer) {
  ir::Graph model = models::copy_task_model();
  auto params = models::copy_task_params();
  train::Trainer t(model, "loss", params, optimizer, b, train::initialize(model, params, {train::Init::xavier_uniform}, 7));
  std::vector<double> r;
  for (int s = 0; s < steps; ++s) r.push_back(t.step(models::copy_task_batch(32, 1000 + static_cast<std::uint64_t>(s))));
  return r;
}

class Training : public ::testing::TestWithParam<std::string> {};

// With SGD the parameters depend smoothly on the gradients, so float32 runs stay close to the
// float64 one. (AdamW's first steps move each parameter by about lr * sign(g), and the sign of a
// near-zero gradient is decided by rounding: no float32 run tracks float64 there but by luck.)
TEST_P(Training, LossesTrackTheReferenceStepByStep) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  constexpr int kSteps = 40;
  auto oracle = backend::make_reference_backend({backend::Precision::f64});
  auto plain = backend::make_reference_backend({backend::Precision::f32});
  auto want = losses(*oracle, kSteps, kSgd), f32 = losses(*plain, kSteps, kSgd), got = losses(*b, kSteps, kSgd);
  for (int s = 0; s < kSteps; ++s) {
    // The budget of every comparison here: a small factor times what a plain float32 run drifts.
    double budget = backend::kDefaultBudgetFactor * std::fabs(f32[static_cast<std::size_t>(s)] - want[static_cast<std::size_t>(s)]) +
                    4 * 1.2e-7 * std::fabs(want[static_cast<std::size_t>(s)]);
    EXPECT_LE(std::fabs(got[static_cast<std::size_t>(s)] - want[static_cast<std::size_t>(s)]), budget)
        << "step " << s << ": " << got[static_cast<std::size_t>(s)] << " vs " << want[static_cast<std::size_t>(s)];
  }
  EXPECT_LT(want.back(), want.front() * 0.7);  // and the run being tracked does learn
}

TEST_P(Training, LearnsTheCopyTaskWithEitherOptimizer) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  for (const auto& [name, optimizer] : {std::pair{"sgd", kSgd}, std::pair{"adamw", kAdamW}}) {
    auto l = losses(*b, 70, optimizer);
    EXPECT_LT(l.back(), 0.25 * models::copy_task_chance_loss()) << name << ": first " << l.front();
  }
}

TEST_P(Training, KeepsAttentionFused) {
  // The copy task's step graph runs attention forward and backward as fused nodes on each
  // backend: no softmax over the scores, and no matmul computing them.
  ir::Graph model = models::copy_task_model();
  auto params = models::copy_task_params();
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  train::Trainer t(model, "loss", params, kSgd, *b, train::initialize(model, params, {train::Init::xavier_uniform}, 7));
  int forward = 0, backward = 0;
  for (const ir::Node& n : t.compiled_graph().nodes()) {
    forward += n.op == ir::Op::attention || n.op == ir::Op::masked_attention;
    backward += n.op == ir::Op::attention_grad || n.op == ir::Op::masked_attention_grad;
    EXPECT_NE(n.op, ir::Op::softmax);
  }
  EXPECT_GE(forward, 1) << ir::print(t.compiled_graph());
  EXPECT_EQ(backward, 3 * forward) << ir::print(t.compiled_graph());
}

/// Mixed precision computing in `dtype`, loss scaling (for f16) from `init_scale`, growing it
/// after `growth_interval` good steps.
train::MixedPrecision mixed_precision(DType dtype, double init_scale = 65536.0, int growth_interval = 2000) {
  train::MixedPrecision m;
  m.compute = dtype;
  m.scaling.init_scale = init_scale;
  m.scaling.growth_interval = growth_interval;
  return m;
}

/// The copy-task losses per step in mixed precision (`dtype` compute, f32 parameters).
std::vector<double> mixed_losses(backend::Backend& b, int steps, const train::Optimizer& optimizer, DType dtype) {
  ir::Graph model = models::copy_task_model();
  auto params = models::copy_task_params();
  train::Trainer t(model, "loss", params, optimizer, b, train::initialize(model, params, {train::Init::xavier_uniform}, 7), {},
                   mixed_precision(dtype));
  std::vector<double> r;
  for (int s = 0; s < steps; ++s) {
    r.push_back(t.step(models::copy_task_batch(32, 1000 + static_cast<std::uint64_t>(s))));
    EXPECT_FALSE(t.last_step_skipped()) << "step " << s;  // the copy task's gradients never overflow
  }
  return r;
}

// f16 (with loss scaling) and bf16 activations and gradients over f32 master parameters: the
// run learns the copy task as the f32 run does, its losses close to the f32 run's step by step
// (within what rounding activations to 11 or 8 significant bits moves them).
TEST_P(Training, MixedPrecisionTracksTheF32RunAndLearns) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  constexpr int kSteps = 70;
  const std::vector<double> f32 = losses(*b, kSteps, kAdamW);
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<double> mixed = mixed_losses(*b, kSteps, kAdamW, dtype);
    const double tolerance = dtype == DType::f16 ? 0.02 : 0.1;  // relative, of the loss
    for (int s = 0; s < 10; ++s)                                // early steps, before the runs' paths part by chaos
      EXPECT_NEAR(mixed[static_cast<std::size_t>(s)], f32[static_cast<std::size_t>(s)], tolerance * f32[static_cast<std::size_t>(s)]) << "step " << s;
    EXPECT_LT(mixed.back(), 0.25 * models::copy_task_chance_loss()) << "first " << mixed.front();
  }
}

TEST_P(Training, MixedPrecisionRunsMatmulsInHalfAndKeepsParametersF32) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  ir::Graph model = models::copy_task_model();
  auto params = models::copy_task_params();
  train::Trainer t(model, "loss", params, kSgd, *b, train::initialize(model, params, {train::Init::xavier_uniform}, 7), {},
                   mixed_precision(DType::bf16));
  int half_matmuls = 0, f32_matmuls = 0;
  for (const ir::Node& n : t.graph().nodes()) {
    half_matmuls += n.op == ir::Op::matmul && n.dtype == DType::bf16;
    f32_matmuls += n.op == ir::Op::matmul && n.dtype == DType::f32;
  }
  EXPECT_GT(half_matmuls, 0) << ir::print(t.graph());
  EXPECT_EQ(f32_matmuls, 0) << ir::print(t.graph());
  t.step(models::copy_task_batch(32, 1));
  for (const auto& [name, value] : t.parameters()) EXPECT_EQ(value.dtype(), DType::f32) << name;
  EXPECT_EQ(t.loss_scale(), 1.0);  // bf16 needs no loss scaling
}

// A model wholly in bf16 (parameters, momentum and gradients: PyTorch's model.bfloat16(), no
// master copy) still learns the copy task with SGD; its parameters stay bf16.
TEST_P(Training, ParametersInBf16TrainWhollyInIt) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  const ir::Graph model = ir::to_dtype(models::copy_task_model(), DType::bf16);
  const auto params = models::copy_task_params();
  backend::TensorMap initial = train::initialize(models::copy_task_model(), params, {train::Init::xavier_uniform}, 7);
  for (auto& [name, t] : initial) t = t.to(DType::bf16);
  train::Trainer t(model, "loss", params, kSgd, *b, initial);
  double first = 0, last = 0;
  for (int s = 0; s < 70; ++s) {
    last = t.step(models::copy_task_batch(32, 1000 + static_cast<std::uint64_t>(s)));
    if (s == 0) first = last;
  }
  EXPECT_LT(last, 0.25 * models::copy_task_chance_loss()) << "first " << first;
  for (const auto& [name, value] : t.parameters()) EXPECT_EQ(value.dtype(), DType::bf16) << name;
}

// An injected overflow (a loss scale of 1e30: the gradients overflow f16 whatever the batch)
// skips its steps, leaving parameters and optimizer state as they were and halving the scale each
// time, until the gradients fit and the steps train again; growth_interval good steps in a row
// double the scale.
TEST_P(Training, LossScalingSkipsAnOverflowingStepAndRecovers) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  ir::Graph model = models::copy_task_model();
  auto params = models::copy_task_params();
  const train::MixedPrecision mixed = mixed_precision(DType::f16, 1024.0, 3);
  train::Trainer t(model, "loss", params, kAdamW, *b, train::initialize(model, params, {train::Init::xavier_uniform}, 7), {}, mixed);
  EXPECT_EQ(t.loss_scale(), 1024.0);
  t.step(models::copy_task_batch(32, 1));
  EXPECT_FALSE(t.last_step_skipped());
  const backend::TensorMap before = t.parameters();
  // A huge loss scale overflows f16 gradients whatever the batch: the scaled loss's gradient
  // (1e30 rounds to inf in f16) is the injected overflow.
  train::Trainer overflow(model, "loss", params, kAdamW, *b, before, {}, mixed_precision(DType::f16, 1e30, 3));
  overflow.step(models::copy_task_batch(32, 2));
  EXPECT_TRUE(overflow.last_step_skipped());
  EXPECT_EQ(overflow.loss_scale(), static_cast<double>(static_cast<float>(1e30)) * 0.5);  // the scale is an f32
  for (const auto& [name, value] : overflow.parameters())
    for (std::int64_t i = 0; i < value.numel(); ++i) ASSERT_EQ(value.at(i), before.at(name).at(i)) << name << "[" << i << "]";
  // Each overflowing step halves the scale, until the gradients fit (the copy task's settle near
  // 2^21: its loss is a mean over 256 tokens); from then on the steps train.
  int skipped = 1, s = 0;
  for (; s < 150 && overflow.last_step_skipped(); ++s) {
    overflow.step(models::copy_task_batch(32, 100 + static_cast<std::uint64_t>(s)));
    skipped += overflow.last_step_skipped();
  }
  EXPECT_GT(skipped, 50);
  EXPECT_LT(s, 150) << "the scale never came down to where the gradients fit";
  EXPECT_LT(overflow.loss_scale(), 1e9);
  int trained = 1;  // the step that ended the loop
  for (int i = 0; i < 6; ++i) {
    overflow.step(models::copy_task_batch(32, 300 + static_cast<std::uint64_t>(i)));
    trained += !overflow.last_step_skipped();
  }
  EXPECT_GE(trained, 5);
  bool moved = false;
  for (const auto& [name, value] : overflow.parameters())
    for (std::int64_t i = 0; i < value.numel() && !moved; ++i) moved = value.at(i) != before.at(name).at(i);
  EXPECT_TRUE(moved);
  // The first trainer's scale: two good steps so far at 1024, then a third grows it.
  t.step(models::copy_task_batch(32, 4));
  t.step(models::copy_task_batch(32, 5));
  EXPECT_EQ(t.loss_scale(), 2048.0);
}

INSTANTIATE_TEST_SUITE_P(All, Training, ::testing::Values("cpu", "vulkan"), ::qkv::testing::BackendParamName());

}  // namespace
}  // namespace qkv
