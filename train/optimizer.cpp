// SGD and AdamW, written as IR updates.
#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::train {

namespace {

using ir::Graph;
using ir::Op;
using ir::ValueId;

ValueId input_named(const Graph& g, const std::string& name) {
  for (ValueId v : g.inputs())
    if (g.node(v).name == name) return v;
  throw ShapeError("optimizer: the graph has no input '" + name + "'");
}

struct Emitter {
  Graph& g;
  ValueId c(double x) { return g.constant(x); }
  ValueId add(ValueId a, ValueId b) { return g.add(Op::add, {a, b}); }
  ValueId sub(ValueId a, ValueId b) { return g.add(Op::sub, {a, b}); }
  ValueId mul(ValueId a, ValueId b) { return g.add(Op::mul, {a, b}); }
  ValueId div(ValueId a, ValueId b) { return g.add(Op::div, {a, b}); }
};

/// Sets an update of the step graph (with loss scaling, one kept only when the step is not skipped).
using SetUpdate = std::function<void(const std::string&, ValueId)>;

void sgd(Graph& g, const std::string& p, ValueId w, ValueId grad, const Sgd& o, const SetUpdate& set_update) {
  Emitter e{g};
  if (o.weight_decay != 0) grad = e.add(grad, e.mul(e.c(o.weight_decay), w));
  if (o.momentum != 0) {
    ValueId m = g.add_input(p + ".momentum", g.node(w).dtype, g.node(w).shape);  // the parameter's dtype
    grad = e.add(e.mul(e.c(o.momentum), m), grad);
    set_update(p + ".momentum", grad);
  }
  set_update(p, e.sub(w, e.mul(e.c(o.lr), grad)));
}

void adamw(Graph& g, const std::string& p, ValueId w, ValueId grad, const AdamW& o, ValueId step, const SetUpdate& set_update) {
  Emitter e{g};
  const ir::Shape s = g.node(w).shape;  // a copy: adding inputs moves the node storage
  const DType dt = g.node(w).dtype;     // the moments in the parameter's dtype
  ValueId m = g.add_input(p + ".m", dt, s), v = g.add_input(p + ".v", dt, s);
  ValueId m1 = e.add(e.mul(e.c(o.beta1), m), e.mul(e.c(1 - o.beta1), grad));
  ValueId v1 = e.add(e.mul(e.c(o.beta2), v), e.mul(e.c(1 - o.beta2), e.mul(grad, grad)));
  // Bias corrections 1 - beta^t with t the new step count, as exp(t log beta).
  ValueId bc1 = e.sub(e.c(1), g.add(Op::exp, {e.mul(step, e.c(std::log(o.beta1)))}));
  ValueId bc2 = e.sub(e.c(1), g.add(Op::exp, {e.mul(step, e.c(std::log(o.beta2)))}));
  ValueId denom = e.add(g.add(Op::sqrt, {e.div(v1, bc2)}), e.c(o.eps));
  ValueId decayed = e.mul(w, e.c(1 - o.lr * o.weight_decay));
  set_update(p, e.sub(decayed, e.mul(e.c(o.lr), e.div(e.div(m1, bc1), denom))));
  set_update(p + ".m", m1);
  set_update(p + ".v", v1);
}

/// The input named `name` of `g`, added (an f32 scalar) when `g` has none.
ValueId scalar_input(Graph& g, const std::string& name) {
  for (ValueId v : g.inputs())
    if (g.node(v).name == name) return v;
  return g.add_input(name, DType::f32, {});
}

/// 0 when every element of `x` is finite, NaN otherwise: the sum of x * 0 over all its axes.
ValueId nonfinite_probe(Graph& g, ValueId x) {
  ValueId r = g.add(Op::mul, {x, g.constant(0.0)});
  ir::Attrs first;
  first.axis = 0;
  first.keepdim = false;
  while (g.node(r).shape.rank > 0) r = g.add(Op::reduce_sum, {r}, first);
  return r;
}

}  // namespace

ir::Graph with_scaled_loss(const ir::Graph& forward, const std::string& loss) {
  Graph g = ir::rebuild(forward);
  const ValueId l = g.cast(g.output(loss), DType::f32);
  g.set_output(kScaledLoss, g.add(Op::mul, {l, g.add_input(kLossScale, DType::f32, {})}));
  return g;
}

ir::Graph training_step(const ir::Graph& backward, const std::vector<std::string>& params, const Optimizer& optimizer, const LossScaling* scaling) {
  Graph g = ir::rebuild(backward);
  // With loss scaling: the gradients unscaled, and whether all of them are finite.
  ValueId scale = -1, finite = -1;
  std::vector<ValueId> grads;
  if (scaling) {
    scale = scalar_input(g, kLossScale);
    const ValueId inv = g.add(Op::div, {g.constant(1.0), scale});
    ValueId probe = -1;
    for (const auto& p : params) {
      grads.push_back(g.add(Op::mul, {g.output("d_" + p), inv}));
      const ValueId q = nonfinite_probe(g, grads.back());
      probe = probe < 0 ? q : g.add(Op::add, {probe, q});
    }
    finite = g.add(Op::equal, {probe, g.constant(0.0)});  // NaN == 0 is false
  }
  // A step with a non-finite gradient changes nothing but the scale (GradScaler skips
  // optimizer.step()): with loss scaling, every update keeps the old value unless all gradients
  // were finite.
  const SetUpdate set_update = [&g, finite](const std::string& name, ValueId v) {
    g.set_update(name, finite < 0 ? v : g.add(Op::where, {finite, v, input_named(g, name)}));
  };
  if (grads.empty())
    for (const auto& p : params) grads.push_back(g.output("d_" + p));
  // clip_grad_norm_: every gradient times min(1, max_norm / (global L2 norm + 1e-6)), in f32.
  const double max_norm = std::visit([](const auto& o) { return o.max_grad_norm; }, optimizer);
  if (max_norm > 0) {
    ValueId squares = -1;
    for (ValueId grad : grads) {
      const ValueId wide = g.cast(grad, DType::f32);  // squares of f16 gradients past 256 overflow f16
      ValueId sq = g.add(Op::mul, {wide, wide});
      ir::Attrs first;
      first.axis = 0;
      first.keepdim = false;
      while (g.node(sq).shape.rank > 0) sq = g.add(Op::reduce_sum, {sq}, first);
      squares = squares < 0 ? sq : g.add(Op::add, {squares, sq});
    }
    const ValueId norm = g.add(Op::sqrt, {squares});
    const ValueId coef = g.add(Op::div, {g.constant(max_norm), g.add(Op::add, {norm, g.constant(1e-6)})});
    const ValueId clamped = g.add(Op::where, {g.add(Op::greater, {coef, g.constant(1.0)}), g.constant(1.0), coef});
    for (ValueId& grad : grads) grad = g.add(Op::mul, {grad, g.cast(clamped, g.node(grad).dtype)});
    g.set_output(kGradNorm, norm);
  }
  ValueId step = -1;
  if (std::holds_alternative<AdamW>(optimizer)) {
    ValueId t = g.add_input("adamw.step", DType::f32, {});
    step = g.add(Op::add, {t, g.constant(1.0)});
    set_update("adamw.step", step);
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string& p = params[i];
    ValueId w = input_named(g, p);
    ValueId grad = grads[i];
    if (const auto* s = std::get_if<Sgd>(&optimizer)) sgd(g, p, w, grad, *s, set_update);
    else adamw(g, p, w, grad, std::get<AdamW>(optimizer), step, set_update);
  }
  if (scaling) {
    const ValueId good = scalar_input(g, kGoodSteps);
    const ValueId good1 = g.add(Op::where, {finite, g.add(Op::add, {good, g.constant(1.0)}), g.constant(0.0)});
    const ValueId grow = g.add(Op::greater, {good1, g.constant(scaling->growth_interval - 0.5)});
    const ValueId kept = g.add(Op::where, {grow, g.add(Op::mul, {scale, g.constant(scaling->growth_factor)}), scale});
    g.set_update(kLossScale, g.add(Op::where, {finite, kept, g.add(Op::mul, {scale, g.constant(scaling->backoff_factor)})}));
    g.set_update(kGoodSteps, g.add(Op::where, {grow, g.constant(0.0), good1}));
    g.set_output(kSkipped, g.add(Op::where, {finite, g.constant(0.0), g.constant(1.0)}));
  }
  std::vector<std::string> keep;
  for (const auto& [name, v] : g.outputs()) {
    const bool gradient = std::find(params.begin(), params.end(), name.substr(name.rfind("d_", 0) == 0 ? 2 : name.size())) != params.end();
    if (!gradient && name != kScaledLoss) keep.push_back(name);
  }
  return ir::select_outputs(g, keep);
}

backend::TensorMap initial_optimizer_state(const ir::Graph& step, const backend::TensorMap& params) {
  backend::TensorMap r;
  for (const auto& [name, v] : step.updates()) {
    if (params.contains(name)) continue;
    const ir::Node& n = step.node(input_named(step, name));
    std::vector<std::int64_t> shape;
    if (n.shape.is_static()) {
      shape = ir::to_vector(n.shape);
    } else {
      const std::string base = name.substr(0, name.rfind('.'));
      shape = params.at(base).shape();  // a parameter's moments have its shape
    }
    r.emplace(name, Tensor(n.dtype, shape));
  }
  return r;
}

}  // namespace qkv::train
