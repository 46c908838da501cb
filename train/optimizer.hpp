// Optimizers as graph updates: a training step is one graph that computes the loss, the
// gradients and the new parameters and optimizer state, all on the backend.
#pragma once

#include <string>
#include <variant>
#include <vector>

#include "backends/backend.hpp"

namespace qkv::train {

/// PyTorch's SGD: g += weight_decay * p; v = momentum * v + g (when momentum > 0); p -= lr * v.
/// max_grad_norm > 0 clips the gradients first, as torch.nn.utils.clip_grad_norm_: all of them
/// scaled by min(1, max_grad_norm / (their global L2 norm + 1e-6)).
struct Sgd {
  double lr = 0.01;            ///< learning rate
  double momentum = 0.0;       ///< 0: plain SGD, no velocity state
  double weight_decay = 0.0;   ///< L2 penalty added to the gradient
  double max_grad_norm = 0.0;  ///< clip the gradients' global norm to this (0: no clipping)
};

/// PyTorch's AdamW: p *= 1 - lr * weight_decay; m, v moving averages of g and g^2; p -= lr *
/// m_hat / (sqrt(v_hat) + eps) with bias corrections from the step count, all in the graph.
struct AdamW {
  double lr = 1e-3;            ///< learning rate
  double beta1 = 0.9;          ///< decay of the gradient's moving average m
  double beta2 = 0.999;        ///< decay of the squared gradient's moving average v
  double eps = 1e-8;           ///< added to sqrt(v_hat) in the denominator
  double weight_decay = 0.01;  ///< decoupled weight decay, applied to the parameters
  double max_grad_norm = 0.0;  ///< as Sgd's
};

/// An optimizer and its settings: what the trainer writes into the step graph as updates.
using Optimizer = std::variant<Sgd, AdamW>;

/// Dynamic loss scaling for f16 gradients (torch.cuda.amp.GradScaler, with its defaults): the
/// loss is multiplied by a scale before the backward, so that small gradients do not flush to
/// zero in f16; the gradients are divided by it before the update. A step whose gradients hold an
/// inf or NaN is skipped (parameters and optimizer state unchanged) and the scale multiplied by
/// `backoff_factor`; after `growth_interval` steps in a row without one, it is multiplied by
/// `growth_factor`. All of it runs in the step graph, on the backend.
struct LossScaling {
  double init_scale = 65536.0;  ///< the scale of the first step
  double growth_factor = 2.0;   ///< the scale's factor after growth_interval good steps
  double backoff_factor = 0.5;  ///< the scale's factor after a skipped step
  int growth_interval = 2000;   ///< good steps in a row before the scale grows
};

/// The names loss scaling adds to a step graph: its state (the scale, and the count of good steps
/// since it last changed), the scaled loss the backward differentiates, and an output that is 1
/// for a skipped step, else 0.
inline constexpr const char* kLossScale = "amp.scale";
inline constexpr const char* kGoodSteps = "amp.good_steps";    ///< state: good steps since the scale last changed
inline constexpr const char* kScaledLoss = "amp.scaled_loss";  ///< output: the loss times the scale
inline constexpr const char* kSkipped = "amp.skipped";         ///< output: 1 for a skipped step, else 0
/// The output of a step with gradient clipping: the gradients' global L2 norm before clipping.
inline constexpr const char* kGradNorm = "grad_norm";

/// `forward` with output kScaledLoss = (its output `loss`, as f32) * the scalar input kLossScale:
/// the output to differentiate when the loss is scaled.
ir::Graph with_scaled_loss(const ir::Graph& forward, const std::string& loss);

/// The training step graph: `backward` (with outputs "d_<p>" for each parameter p) plus updates
/// of every parameter and of the optimizer's own state inputs: "<p>.momentum" for SGD with
/// momentum; "<p>.m", "<p>.v" and the scalar "adamw.step" for AdamW (a parameter's state in its
/// dtype: an f16 or bf16 parameter trains wholly in it, as PyTorch's model.half()). Its outputs are
/// `backward`'s outputs other than the gradients (the gradients feed the updates on the backend).
/// With `scaling`, the gradients are scaled ones (of kScaledLoss, or averages of them): the step
/// unscales them, skips the updates when one is not finite, updates the scale (inputs kLossScale
/// and kGoodSteps, added when `backward` lacks them) and outputs kSkipped. With max_grad_norm, the
/// (unscaled) gradients are clipped before the update and kGradNorm is an output.
ir::Graph training_step(const ir::Graph& backward, const std::vector<std::string>& params, const Optimizer& optimizer,
                        const LossScaling* scaling = nullptr);

/// Zero tensors for every input of `step` that the optimizer added (held on the backend with the
/// parameters).
backend::TensorMap initial_optimizer_state(const ir::Graph& step, const backend::TensorMap& params);

}  // namespace qkv::train
