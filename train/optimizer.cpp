// SGD and AdamW, written as IR updates.
#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>

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

void sgd(Graph& g, const std::string& p, ValueId w, ValueId grad, const Sgd& o) {
  Emitter e{g};
  if (o.weight_decay != 0) grad = e.add(grad, e.mul(e.c(o.weight_decay), w));
  if (o.momentum != 0) {
    ValueId m = g.add_input(p + ".momentum", DType::f32, g.node(w).shape);
    grad = e.add(e.mul(e.c(o.momentum), m), grad);
    g.set_update(p + ".momentum", grad);
  }
  g.set_update(p, e.sub(w, e.mul(e.c(o.lr), grad)));
}

void adamw(Graph& g, const std::string& p, ValueId w, ValueId grad, const AdamW& o, ValueId step) {
  Emitter e{g};
  const ir::Shape s = g.node(w).shape;  // a copy: adding inputs moves the node storage
  ValueId m = g.add_input(p + ".m", DType::f32, s), v = g.add_input(p + ".v", DType::f32, s);
  ValueId m1 = e.add(e.mul(e.c(o.beta1), m), e.mul(e.c(1 - o.beta1), grad));
  ValueId v1 = e.add(e.mul(e.c(o.beta2), v), e.mul(e.c(1 - o.beta2), e.mul(grad, grad)));
  // Bias corrections 1 - beta^t with t the new step count, as exp(t log beta).
  ValueId bc1 = e.sub(e.c(1), g.add(Op::exp, {e.mul(step, e.c(std::log(o.beta1)))}));
  ValueId bc2 = e.sub(e.c(1), g.add(Op::exp, {e.mul(step, e.c(std::log(o.beta2)))}));
  ValueId denom = e.add(g.add(Op::sqrt, {e.div(v1, bc2)}), e.c(o.eps));
  ValueId decayed = e.mul(w, e.c(1 - o.lr * o.weight_decay));
  g.set_update(p, e.sub(decayed, e.mul(e.c(o.lr), e.div(e.div(m1, bc1), denom))));
  g.set_update(p + ".m", m1);
  g.set_update(p + ".v", v1);
}

}  // namespace

ir::Graph training_step(const ir::Graph& backward, const std::vector<std::string>& params, const Optimizer& optimizer) {
  Graph g = ir::rebuild(backward);
  ValueId step = -1;
  if (std::holds_alternative<AdamW>(optimizer)) {
    ValueId t = g.add_input("adamw.step", DType::f32, {});
    step = g.add(Op::add, {t, g.constant(1.0)});
    g.set_update("adamw.step", step);
  }
  for (const auto& p : params) {
    ValueId w = input_named(g, p);
    ValueId grad = g.output("d_" + p);
    if (const auto* s = std::get_if<Sgd>(&optimizer)) sgd(g, p, w, grad, *s);
    else adamw(g, p, w, grad, std::get<AdamW>(optimizer), step);
  }
  std::vector<std::string> keep;
  for (const auto& [name, v] : g.outputs())
    if (std::find(params.begin(), params.end(), name.substr(name.rfind("d_", 0) == 0 ? 2 : name.size())) == params.end()) keep.push_back(name);
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
    r.emplace(name, Tensor(DType::f32, shape));
  }
  return r;
}

}  // namespace qkv::train
