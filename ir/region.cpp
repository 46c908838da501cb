// Score modifier regions: construction, checks, inlining, forward-mode derivatives, printing.
#include "ir/region.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "ir/error.hpp"
#include "ir/gradients.hpp"
#include "ir/printer.hpp"
#include "ir/verifier.hpp"

namespace qkv::ir {

namespace {

std::string input_name(int i) {
  static constexpr std::string_view fixed[kRegionFixedInputs] = {"score", "q_idx", "kv_idx"};
  return i < kRegionFixedInputs ? std::string(fixed[i]) : "t" + std::to_string(i - kRegionFixedInputs);
}

/// A tensor operand's element as the modifier reads it: an f16 or bf16 value widened to f32
/// (the modifier computes on f32 scores, as FlexAttention's kernels do), others as they are.
DType region_dtype(DType tensor) { return is_half(tensor) ? DType::f32 : tensor; }

bool region_op(Op op) {
  const OpCategory c = op_info(op).category;
  return c == OpCategory::unary || c == OpCategory::binary || c == OpCategory::select || c == OpCategory::compare;
}

}  // namespace

Graph make_region(std::span<const DType> tensors) {
  Graph r;
  for (int i = 0; i < kRegionFixedInputs; ++i) r.add_input(input_name(i), DType::f32, {});
  for (std::size_t i = 0; i < tensors.size(); ++i) r.add_input(input_name(kRegionFixedInputs + static_cast<int>(i)), region_dtype(tensors[i]), {});
  return r;
}

std::string check_region(const Graph& r, std::span<const DType> tensors) {
  const std::size_t inputs = kRegionFixedInputs + tensors.size();
  if (r.size() < inputs)
    return "its modifier region declares " + std::to_string(r.size()) + " values, fewer than its " + std::to_string(inputs) + " inputs";
  for (std::size_t i = 0; i < r.size(); ++i) {
    const Node& n = r.nodes()[i];
    const std::string where = "modifier %" + std::to_string(i) + " (" + std::string(op_name(n.op)) + ")";
    if (n.shape.rank != 0) return where + " is not a scalar";
    if (i < inputs) {
      const DType want = i < kRegionFixedInputs ? DType::f32 : region_dtype(tensors[i - kRegionFixedInputs]);
      if (n.op != Op::input || n.name != input_name(static_cast<int>(i)) || n.dtype != want)
        return where + " should be input \"" + input_name(static_cast<int>(i)) + "\" of " + std::string(dtype_name(want)) +
               " (the modifier's inputs are score, q_idx, kv_idx, then one per tensor operand)";
    } else if (n.op == Op::input) {
      return where + ": \"" + n.name + "\" is not one of the modifier's inputs";
    } else if (n.op == Op::constant) {
      if (n.attrs.rsqrt_of != 0) return where + " depends on a dim";
    } else if (!region_op(n.op)) {
      return where + " is not elementwise";
    }
  }
  if (r.outputs().size() != 1 || r.outputs()[0].first != "mod") return "its modifier region must return one value named mod";
  if (!r.updates().empty()) return "its modifier region updates inputs";
  if (r.node(r.outputs()[0].second).dtype != DType::f32) return "its modifier's result is not f32";
  try {
    verify(r);
  } catch (const Error& e) {
    return std::string("its modifier region is not valid IR: ") + e.what();
  }
  return {};
}

std::size_t region_tensors(const Graph& r) {
  std::size_t n = 0;
  for (const Node& node : r.nodes()) n += node.op == Op::input;
  return n - kRegionFixedInputs;
}

bool same_region(const Graph* a, const Graph* b) {
  if (a == b) return true;
  if (!a || !b || a->size() != b->size() || a->outputs() != b->outputs()) return false;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const Node& x = a->nodes()[i];
    const Node& y = b->nodes()[i];
    if (x.op != y.op || x.inputs != y.inputs || !(x.attrs == y.attrs) || x.dtype != y.dtype || x.name != y.name) return false;
  }
  return true;
}

std::size_t region_hash(const Graph* r) {
  if (!r) return 0;
  std::size_t h = r->size();
  for (const Node& n : r->nodes()) h = h * 1000003u ^ node_hash(n.op, n.inputs, n.attrs);
  for (const auto& [name, v] : r->outputs()) h = h * 1000003u ^ static_cast<std::size_t>(v);
  return h;
}

ValueId inline_region(Graph& g, const Graph& r, ValueId score, std::span<const ValueId> tensors) {
  const Shape scores = g.node(score).shape;  // a copy: adding nodes never moves them, but be plain
  // The modifier computes in f32 (region_dtype): half scores and tensors are widened for it, and
  // its result rounded back to the scores' dtype.
  const DType score_dtype = g.node(score).dtype;
  auto widened = [&g](ValueId v) { return is_half(g.node(v).dtype) ? g.cast(v, DType::f32) : v; };
  score = widened(score);
  std::vector<ValueId> map(r.size(), -1);
  for (std::size_t i = 0; i < r.size(); ++i) {
    const Node& n = r.nodes()[i];
    if (n.op == Op::input) {
      Attrs axis;
      if (i == kRegionScore) map[i] = score;
      else if (i == kRegionQIdx || i == kRegionKvIdx) {
        axis.axis = scores.rank - (i == kRegionQIdx ? 2 : 1);
        map[i] = g.add(Op::iota, {score}, axis);
      } else {
        map[i] = widened(tensors[i - kRegionFixedInputs]);
      }
      continue;
    }
    std::vector<ValueId> ins;
    for (ValueId v : n.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
    map[i] = g.add(n.op, std::move(ins), n.attrs);
  }
  ValueId mod = map[static_cast<std::size_t>(r.outputs()[0].second)];
  if (!(g.node(mod).shape == scores)) mod = g.add(Op::broadcast_to, {mod}, shape_attrs(scores));
  return g.cast(mod, score_dtype);
}

Graph differentiate_region(const Graph& r, int wrt, bool keep_primal) {
  Graph d;
  std::vector<ValueId> map(r.size(), -1);
  std::vector<std::optional<ValueId>> tangent(r.size());  // nullopt: structurally zero
  // The inputs first, in their places, then the seed dwrt/dwrt = 1.
  for (std::size_t i = 0; i < r.size(); ++i)
    if (r.nodes()[i].op == Op::input) map[i] = d.add_like(r.nodes()[i], {});
  tangent[static_cast<std::size_t>(wrt)] = d.constant(1.0);
  for (std::size_t i = 0; i < r.size(); ++i) {
    const Node& n = r.nodes()[i];
    if (n.op == Op::input) continue;
    std::vector<ValueId> in;
    for (ValueId v : n.inputs) in.push_back(map[static_cast<std::size_t>(v)]);
    const ValueId y = map[i] = d.add_like(n, in);
    auto t = [&](int k) { return tangent[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(k)])]; };
    auto mul = [&](ValueId a, ValueId b) { return d.add(Op::mul, {a, b}); };
    auto zero = [&] { return d.constant(0.0); };
    std::optional<ValueId> da = n.inputs.empty() ? std::nullopt : t(0);
    std::optional<ValueId> out;
    // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
    // clang-format off
    switch (n.op) {
      // Inputs are handled above; constants, comparisons and casts are piecewise constant.
      QKV_SOURCE_CASES
      QKV_COMPARE_CASES
      case Op::cast: break;
      // d f(a) = f'(a) da: the registry row's derivative column
      QKV_UNARY_CASES if (da) out = unary_derivative(d, n.op, in[0], y, *da); break;
      // d(a ± b) = da ± db;  d(a b) = da b + a db;  d(a / b) = (da - y db) / b
      case Op::add:
      case Op::sub: {
        std::optional<ValueId> db = t(1);
        if (da && db) out = d.add(n.op, {*da, *db});
        else if (da) out = da;
        else if (db) out = n.op == Op::add ? *db : d.add(Op::neg, {*db});
        break;
      }
      case Op::mul: {
        std::optional<ValueId> db = t(1);
        if (da) out = mul(*da, in[1]);
        if (db) out = out ? d.add(Op::add, {*out, mul(in[0], *db)}) : mul(in[0], *db);
        break;
      }
      case Op::div: {
        std::optional<ValueId> db = t(1);
        if (da || db) {
          ValueId num = da ? *da : zero();
          if (db) num = d.add(Op::sub, {num, mul(y, *db)});
          out = d.add(Op::div, {num, in[1]});
        }
        break;
      }
      // max(a, b) follows a where a >= b (autodiff's rule);  where(c, a, b) selects the tangent
      case Op::max: {
        std::optional<ValueId> db = t(1);
        if (da || db) out = d.add(Op::where, {d.add(Op::greater, {in[1], in[0]}), db ? *db : zero(), da ? *da : zero()});
        break;
      }
      case Op::where: {
        std::optional<ValueId> ta = t(1), tb = t(2);
        if (ta || tb) out = d.add(Op::where, {in[0], ta ? *ta : zero(), tb ? *tb : zero()});
        break;
      }
      QKV_REDUCE_CASES
      QKV_CONTRACT_CASES
      QKV_LAYOUT_CASES
      QKV_MASK_CASES
      QKV_COMPOSITE_CASES
      QKV_ATTENTION_CASES QKV_UNREACHABLE(std::string(op_name(n.op)) + " in a score modifier");
    }
    // clang-format on
    tangent[i] = out;
  }
  const std::optional<ValueId> result = tangent[static_cast<std::size_t>(r.outputs()[0].second)];
  d.set_output("mod", result ? *result : d.constant(0.0));
  if (keep_primal) d.set_output("primal", map[static_cast<std::size_t>(r.outputs()[0].second)]);
  return d;
}

ValueRange ValueRange::exactly(double v) { return std::isnan(v) ? unknown() : ValueRange{v, v, false}; }

namespace {

constexpr double kInf = HUGE_VAL;

/// a + b with -inf + inf (NaN) read as `fallback`: the bound of a sum of two ranges' ends.
double sum_bound(double a, double b, double fallback) {
  const double s = a + b;
  return std::isnan(s) ? fallback : s;
}

ValueRange add_ranges(const ValueRange& a, const ValueRange& b) {
  const bool inf_minus_inf = (a.lo == -kInf && b.hi == kInf) || (a.hi == kInf && b.lo == -kInf);
  return {sum_bound(a.lo, b.lo, -kInf), sum_bound(a.hi, b.hi, kInf), a.nan || b.nan || inf_minus_inf};
}

ValueRange neg_range(const ValueRange& a) { return {-a.hi, -a.lo, a.nan}; }

bool holds(const ValueRange& a, double v) { return a.lo <= v && v <= a.hi; }
bool unbounded(const ValueRange& a) { return a.lo == -kInf || a.hi == kInf; }

ValueRange mul_ranges(const ValueRange& a, const ValueRange& b) {
  // 0 * inf is NaN: a corner product that is NaN bounds nothing (read as 0, which the other
  // corners' signs already cover), and NaN becomes possible.
  const bool zero_times_inf = (holds(a, 0) && unbounded(b)) || (holds(b, 0) && unbounded(a));
  double lo = kInf, hi = -kInf;
  for (double x : {a.lo, a.hi})
    for (double y : {b.lo, b.hi}) {
      double p = x * y;
      if (std::isnan(p)) p = 0;
      lo = std::min(lo, p);
      hi = std::max(hi, p);
    }
  return {lo, hi, a.nan || b.nan || zero_times_inf};
}

ValueRange div_ranges(const ValueRange& a, const ValueRange& b) {
  if (holds(b, 0) || (unbounded(a) && unbounded(b))) return ValueRange::unknown();
  double lo = kInf, hi = -kInf;
  for (double x : {a.lo, a.hi})
    for (double y : {b.lo, b.hi}) {
      lo = std::min(lo, x / y);
      hi = std::max(hi, x / y);
    }
  return {lo, hi, a.nan || b.nan};
}

/// f increasing on [domain_lo, inf]; below it f is NaN.
template <class F> ValueRange increasing(const ValueRange& a, F f, double domain_lo = -kInf) {
  const bool below = a.lo < domain_lo;
  const double lo = below ? f(domain_lo) : f(a.lo), hi = a.hi < domain_lo ? f(domain_lo) : f(a.hi);
  return {lo, hi, a.nan || below};
}

/// f([a]) for a unary op: its row's Monotone column applied to its host expression.
ValueRange unary_range(Op op, const ValueRange& a) {
  auto range = [&](auto f) -> ValueRange {
    switch (unary_monotone(op)) {
      case Monotone::increasing: return increasing(a, f);
      case Monotone::increasing_from_zero: return increasing(a, f, 0.0);
      case Monotone::decreasing: return {f(a.hi), f(a.lo), a.nan};
      case Monotone::periodic: return {-1.0, 1.0, a.nan || unbounded(a)};
    }
    return ValueRange::unknown();
  };
#define QKV_UNARY_RANGE(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, doc, host, glsl, \
                        derivative, monotone)                                                                                                   \
  if (op == Op::id) return range([](double x) { return host; });
  QKV_UNARY_OPS(QKV_UNARY_RANGE)
#undef QKV_UNARY_RANGE
  QKV_UNREACHABLE(std::string(op_name(op)) + " is not a unary op");
}

ValueRange boolean(bool can_be_false, bool can_be_true) { return {can_be_false ? 0.0 : 1.0, can_be_true ? 1.0 : 0.0, false}; }

ValueRange bound_node(const Node& n, const std::vector<ValueRange>& v) {
  auto in = [&](std::size_t i) -> const ValueRange& { return v[static_cast<std::size_t>(n.inputs[i])]; };
  // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
  // clang-format off
  switch (n.op) {
    case Op::constant: return ValueRange::exactly(n.attrs.value);
    QKV_UNARY_CASES return unary_range(n.op, in(0));
    case Op::cast: return in(0);
    case Op::add: return add_ranges(in(0), in(1));
    case Op::sub: return add_ranges(in(0), neg_range(in(1)));
    case Op::mul: return mul_ranges(in(0), in(1));
    case Op::div: return div_ranges(in(0), in(1));
    case Op::max: return {std::max(in(0).lo, in(1).lo), std::max(in(0).hi, in(1).hi), in(0).nan || in(1).nan};
    case Op::equal: {  // a comparison with NaN is false
      const ValueRange &a = in(0), &b = in(1);
      const bool disjoint = a.hi < b.lo || b.hi < a.lo;
      const bool one_value = !a.nan && !b.nan && a.lo == a.hi && b.lo == b.hi && a.lo == b.lo;
      return boolean(!one_value, !disjoint);
    }
    case Op::greater: {
      const ValueRange &a = in(0), &b = in(1);
      return boolean(a.nan || b.nan || a.lo <= b.hi, a.hi > b.lo);
    }
    case Op::where: {
      const ValueRange &c = in(0), &x = in(1), &y = in(2);
      if (!c.nan && !holds(c, 0)) return x;  // always true
      if (c.is(0)) return y;
      return {std::min(x.lo, y.lo), std::max(x.hi, y.hi), x.nan || y.nan};
    }
    case Op::input:  // the score, an index or a tensor's element: anything
    QKV_REDUCE_CASES
    QKV_CONTRACT_CASES
    QKV_LAYOUT_CASES
    QKV_MASK_CASES
    QKV_COMPOSITE_CASES
    QKV_ATTENTION_CASES return ValueRange::unknown();
  }
  // clang-format on
  return ValueRange::unknown();
}

}  // namespace

std::vector<ValueRange> bound_region_nodes(const Graph& r, std::span<const ValueRange> inputs) {
  std::vector<ValueRange> v;
  v.reserve(r.size());
  for (const Node& n : r.nodes()) {
    if (n.op == Op::input) {
      const std::size_t i = v.size();  // a region's inputs come first, in order
      v.push_back(i < inputs.size() ? inputs[i] : ValueRange::unknown());
    } else {
      v.push_back(bound_node(n, v));
    }
  }
  return v;
}

ValueRange bound_region(const Graph& r, std::span<const ValueRange> inputs, std::string_view output) {
  return bound_region_nodes(r, inputs)[static_cast<std::size_t>(r.output(output))];
}

bool region_masks(const Graph& r) {
  for (const Node& n : r.nodes())
    if (n.op == Op::where)
      for (std::size_t i : {1u, 2u}) {
        const Node& branch = r.node(n.inputs[i]);
        if (branch.op == Op::constant && branch.attrs.value == -HUGE_VAL) return true;
      }
  return false;
}

std::vector<std::pair<ValueId, bool>> masking_conditions(const Graph& r) {
  auto minus_inf = [&](ValueId v) { return r.node(v).op == Op::constant && r.node(v).attrs.value == -HUGE_VAL; };
  std::vector<std::pair<ValueId, bool>> conds;
  for (const Node& n : r.nodes()) {
    if (n.op != Op::where || minus_inf(n.inputs[1]) == minus_inf(n.inputs[2])) continue;
    const std::pair<ValueId, bool> cond{n.inputs[0], minus_inf(n.inputs[2])};
    if (std::find(conds.begin(), conds.end(), std::pair{cond.first, !cond.second}) != conds.end()) return {};
    if (std::find(conds.begin(), conds.end(), cond) == conds.end()) conds.push_back(cond);
  }
  return conds;
}

bool conditions_keep(std::span<const ValueRange> ranges, std::span<const std::pair<ValueId, bool>> conds) {
  for (const auto& [cond, when_true] : conds) {
    const ValueRange& c = ranges[static_cast<std::size_t>(cond)];
    if (!(when_true ? !c.nan && (c.lo > 0 || c.hi < 0) : c.is(0))) return false;
  }
  return true;
}

Graph unmasked_region(const Graph& r) {
  const auto conds = masking_conditions(r);
  // What each node is when the conditions keep: itself, or the branch its where selects.
  std::vector<ValueId> alias(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) {
    const Node& n = r.nodes()[i];
    alias[i] = static_cast<ValueId>(i);
    if (n.op != Op::where) continue;
    for (const auto& [cond, when_true] : conds)
      if (n.inputs[0] == cond) alias[i] = alias[static_cast<std::size_t>(n.inputs[when_true ? 1 : 2])];
  }
  std::vector<bool> live(r.size(), false);
  for (const auto& [name, v] : r.outputs()) live[static_cast<std::size_t>(alias[static_cast<std::size_t>(v)])] = true;
  for (std::size_t i = r.size(); i-- > 0;)
    if (live[i] && alias[i] == static_cast<ValueId>(i))
      for (ValueId in : r.nodes()[i].inputs) live[static_cast<std::size_t>(alias[static_cast<std::size_t>(in)])] = true;
  Graph u;
  std::vector<ValueId> map(r.size(), -1);
  for (std::size_t i = 0; i < r.size(); ++i) {
    const Node& n = r.nodes()[i];
    if (n.op != Op::input && (!live[i] || alias[i] != static_cast<ValueId>(i))) continue;
    std::vector<ValueId> in;
    for (ValueId v : n.inputs) in.push_back(map[static_cast<std::size_t>(alias[static_cast<std::size_t>(v)])]);
    map[i] = u.add_like(n, in);  // every input, in its place
  }
  for (const auto& [name, v] : r.outputs()) u.set_output(name, map[static_cast<std::size_t>(alias[static_cast<std::size_t>(v)])]);
  return u;
}

std::string region_expression(const Graph& r) {
  // Precedence: 0 a sum, 1 a product, 2 an atom; operands print parenthesised when looser.
  std::function<std::pair<std::string, int>(ValueId)> expr = [&](ValueId v) -> std::pair<std::string, int> {
    const Node& n = r.node(v);
    auto at = [&](int k, int need) {
      auto [s, p] = expr(n.inputs[static_cast<std::size_t>(k)]);
      return p < need ? "(" + s + ")" : s;
    };
    // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
    // clang-format off
    switch (n.op) {
      case Op::input: return {n.name, 2};
      case Op::constant: return {format_number(n.attrs.value), n.attrs.value < 0 ? 0 : 2};
      case Op::add: return {at(0, 0) + " + " + at(1, 1), 0};
      case Op::sub: return {at(0, 0) + " - " + at(1, 1), 0};
      case Op::mul: return {at(0, 1) + " * " + at(1, 2), 1};
      case Op::div: return {at(0, 1) + " / " + at(1, 2), 1};
      case Op::equal: return {at(0, 0) + " == " + at(1, 0), -1};
      case Op::greater: return {at(0, 0) + " > " + at(1, 0), -1};
      case Op::where: return {"where(" + expr(n.inputs[0]).first + ", " + expr(n.inputs[1]).first + ", " + expr(n.inputs[2]).first + ")", 2};
      case Op::max: return {"max(" + expr(n.inputs[0]).first + ", " + expr(n.inputs[1]).first + ")", 2};
      QKV_UNARY_CASES
      QKV_CAST_CASES
        if (n.op == Op::neg) return {"-" + at(0, 2), 1};
        return {std::string(op_name(n.op)) + "(" + expr(n.inputs[0]).first + ")", 2};
      QKV_REDUCE_CASES
      QKV_CONTRACT_CASES
      QKV_LAYOUT_CASES
      QKV_MASK_CASES
      QKV_COMPOSITE_CASES
      QKV_ATTENTION_CASES break;  // not in a region (check_region)
    }
    // clang-format on
    QKV_UNREACHABLE(std::string(op_name(n.op)) + " in a score modifier");
  };
  return expr(r.outputs()[0].second).first;
}

std::pair<int, int> document_mask_tensors(const Graph& region, const std::vector<std::pair<bool, bool>>& varies) {
  if (!region_masks(region)) return {-1, -1};
  const auto& nodes = region.nodes();
  std::vector<int> uses(nodes.size(), 0);
  for (const Node& node : nodes)
    for (ValueId in : node.inputs) ++uses[static_cast<std::size_t>(in)];
  for (const auto& [name, out] : region.outputs()) ++uses[static_cast<std::size_t>(out)];
  // A tensor input read once (inputs come first, in order: node v is input v).
  auto tensor = [&](ValueId v) {
    const bool once = nodes[static_cast<std::size_t>(v)].op == Op::input && uses[static_cast<std::size_t>(v)] == 1;
    return once && v >= kRegionFixedInputs ? v - kRegionFixedInputs : -1;
  };
  for (const Node& node : nodes) {
    if (node.op != Op::equal) continue;
    int a = tensor(node.inputs[0]), k = tensor(node.inputs[1]);
    if (a < 0 || k < 0) continue;
    if (varies[static_cast<std::size_t>(a)].second) std::swap(a, k);
    if (varies[static_cast<std::size_t>(a)].second || varies[static_cast<std::size_t>(k)].first) continue;
    // With the ids apart (0 and 1) and every other input unknown: -inf. The ids reach the result
    // only through this comparison, so any two that differ (or a NaN) give the same.
    std::vector<ValueRange> in(static_cast<std::size_t>(kRegionFixedInputs) + varies.size(), ValueRange::unknown());
    in[static_cast<std::size_t>(kRegionFixedInputs + a)] = ValueRange::between(0, 0);
    in[static_cast<std::size_t>(kRegionFixedInputs + k)] = ValueRange::between(1, 1);
    if (bound_region(region, in).is(-HUGE_VAL)) return {a, k};
  }
  return {-1, -1};
}

bool has_document_mask(const Node& n, const std::function<const Shape&(ValueId)>& shape) {
  if (!n.region) return false;
  std::vector<std::pair<bool, bool>> varies;  // each modifier tensor: along the queries, along the keys
  for (std::size_t i = 0; i < modifier_tensor_count(n.op, n.attrs, n.inputs.size()); ++i) {
    const Shape& t = shape(n.inputs[fixed_operands(n.op) + i]);
    varies.emplace_back(t.rank >= 2 && t.back(1) != 1, t.rank >= 1 && t.back(0) != 1);
  }
  return document_mask_tensors(*n.region, varies).first >= 0;
}

}  // namespace qkv::ir
