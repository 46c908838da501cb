// Test cases of every op: broadcasting, odd sizes, every axis and attribute.
#include "sweeps/op_cases.hpp"

#include <cmath>
#include <set>

#include "ir/region.hpp"

namespace qkv::ir {

namespace {

Attrs axis(int a, bool keepdim = true) {
  Attrs r;
  r.axis = a;
  r.keepdim = keepdim;
  return r;
}
Attrs transpose(bool ta, bool tb) {
  Attrs r;
  r.transpose_a = ta;
  r.transpose_b = tb;
  return r;
}
Attrs perm(std::initializer_list<int> p) {
  Attrs r;
  int i = 0;
  for (int v : p) r.perm[static_cast<std::size_t>(i++)] = static_cast<std::int8_t>(v);
  return r;
}
Attrs shape(std::initializer_list<Dim> s, double value = 0.0) {
  Attrs r = shape_attrs(Shape(s));
  r.value = value;
  return r;
}
/// An attention op's attributes: its scale.
Attrs scaled(double scale) {
  Attrs r;
  r.scale = scale;
  return r;
}
Attrs align(CausalAlign a, std::int64_t window = 0) {
  Attrs r;
  r.align = a;
  r.window = window;
  return r;
}
/// Score modifiers for the flex attention cases: soft-capping at 2 (so that random scores feel
/// it), an ALiBi-like bias slope t0 * (kv_idx - q_idx), an additive bias t0 after soft-capping,
/// a document mask keeping keys whose id t1 equals the query's id t0, and none (the score itself).
enum class Mod { softcap, slope, capped_bias, document, none };
std::shared_ptr<const Graph> modifier(Mod m) {
  const std::vector<DType> f32 = {DType::f32}, ids = {DType::i32, DType::i32};
  Graph r = make_region(m == Mod::softcap || m == Mod::none ? std::span<const DType>{}
                        : m == Mod::document                ? std::span<const DType>(ids)
                                                            : std::span<const DType>(f32));
  const ValueId score = kRegionScore, t0 = kRegionFixedInputs;
  auto cap = [&](ValueId s) {
    const ValueId c = r.constant(2.0);
    return r.add(Op::mul, {r.add(Op::tanh, {r.add(Op::div, {s, c})}), c});
  };
  ValueId mod = score;
  switch (m) {
    case Mod::none: break;
    case Mod::softcap: mod = cap(score); break;
    case Mod::slope: mod = r.add(Op::add, {score, r.add(Op::mul, {t0, r.add(Op::sub, {kRegionKvIdx, kRegionQIdx})})}); break;
    case Mod::capped_bias: mod = r.add(Op::add, {cap(score), t0}); break;
    case Mod::document: {
      Attrs f32_cast;
      f32_cast.dtype = DType::f32;
      const ValueId same = r.add(Op::equal, {r.add(Op::cast, {t0}, f32_cast), r.add(Op::cast, {t0 + 1}, f32_cast)});
      mod = r.add(Op::where, {same, score, r.constant(-HUGE_VAL)});
      break;
    }
  }
  r.set_output("mod", mod);
  return std::make_shared<const Graph>(std::move(r));
}

/// `a` with attention sinks: the sink logits the operand after the modifier's tensors.
Attrs sunk(Attrs a) {
  a.sink = true;
  return a;
}

/// `a` dropping flex attention's weights with probability p (the seed its last operand).
Attrs dropout(Attrs a, double p) {
  a.dropout = p;
  return a;
}

Attrs range(int ax, std::int64_t begin, std::int64_t end) {
  Attrs r = axis(ax);
  r.begin = begin;
  r.end = end;
  return r;
}

// One function per cases column of ops.def, its cases named for what they exercise.
namespace cases {

// Each unary op over its domain, each binary op with a right operand of the fill given.
std::vector<OpCase> unary(Fill fill) { return {{"3x5", {{{3, 5}, fill}}, {}}, {"2x3x17", {{{2, 3, 17}, fill}}, {}}, {"scalar", {{{}, fill}}, {}}}; }
std::vector<OpCase> binary(Fill rhs = Fill::normal) {
  return {{"same 4x7", {{{4, 7}}, {{4, 7}, rhs}}, {}},
          {"row broadcast", {{{3, 4, 5}}, {{1, 5}, rhs}}, {}},
          {"both broadcast", {{{3, 1, 5}}, {{4, 1}, rhs}}, {}},
          {"scalar rhs", {{{2, 6}}, {{}, rhs}}, {}}};
}

std::vector<OpCase> input() { return {{"2x3", {{{2, 3}}}, shape({2, 3})}}; }

std::vector<OpCase> constant() { return {{"scalar", {}, shape({}, 0.125)}, {"2x3 fill", {}, shape({2, 3}, -1.5)}}; }

std::vector<OpCase> cast() { return {{"ids 2x3", {{{2, 3}, Fill::ids}}, {}}, {"bool 3x4", {{{3, 4}, Fill::boolean}}, {}}}; }

std::vector<OpCase> slice() {
  return {{"middle of the last axis", {{{3, 10}}}, range(1, 2, 7)},
          {"leading rows", {{{6, 4, 5}}}, range(0, 0, 3)},
          {"tail of a middle axis", {{{2, 8, 3}}}, range(1, 5, 8)}};
}

std::vector<OpCase> concat() {
  return {{"rows", {{{2, 3}}, {{4, 3}}}, axis(0)},
          {"last axis", {{{2, 3, 4}}, {{2, 3, 5}}}, axis(2)},
          {"middle axis", {{{2, 1, 3}}, {{2, 4, 3}}}, axis(1)}};
}

std::vector<OpCase> iota() { return {{"axis 1 of 3x5", {{{3, 5}}}, axis(1)}, {"axis 0 of 2x3x4", {{{2, 3, 4}}}, axis(0)}}; }

std::vector<OpCase> dropout_mask() {
  Attrs p, none, most;
  p.dropout = 0.3;
  most.dropout = 0.9;
  return {{"p 0.3", {{{4, 33}}, {{}, Fill::seed}}, p}, {"p 0", {{{3, 5}}, {{}, Fill::seed}}, none}, {"p 0.9", {{{5, 7}}, {{}, Fill::seed}}, most}};
}

std::vector<OpCase> compare() { return {{"same", {{{3, 4}}, {{3, 4}}}, {}}, {"broadcast", {{{2, 3, 4}}, {{1, 4}}}, {}}}; }

std::vector<OpCase> broadcast_to() { return {{"rows", {{{1, 5}}}, shape({3, 5})}, {"new leading dims", {{{4, 1}}}, shape({2, 4, 6})}}; }

std::vector<OpCase> one_hot() {
  Attrs d;
  d.depth = 5;
  return {{"ids 2x3", {{{2, 3}, Fill::ids}}, d}};
}

// Caches of 6 rows along the axis, 2 or 3 written at a start from -1 to 6 (the ids fill): some
// writes fall partly or wholly outside.
std::vector<OpCase> cache_write() {
  return {{"keys 2x6x3 <- 2x2x3", {{{2, 6, 3}}, {{2, 2, 3}}, {{}, Fill::ids}}, axis(1)},
          {"heads 2x2x6x4 <- 2x2x3x4", {{{2, 2, 6, 4}}, {{2, 2, 3, 4}}, {{}, Fill::ids}}, axis(-2)}};
}

// Pages [3, 2, 4, 5] (12 slots) and 6 new tokens at distinct slots in [-1, 14): some outside.
std::vector<OpCase> page_write() {
  return {{"2 sequences of 3 into 3 pages of 4", {{{3, 2, 4, 5}}, {{2, 2, 3, 5}}, {{2, 3}, Fill::slots}}, {}},
          {"1 token each, pages of 1", {{{7, 1, 1, 3}}, {{3, 1, 1, 3}}, {{3, 1}, Fill::slots}}, {}}};
}

// Tables of entries in [-1, 6] over 5 pages: some pages read twice, some entries outside.
std::vector<OpCase> page_gather() {
  return {{"2 sequences of 3 pages of 2", {{{5, 2, 2, 3}}, {{2, 3}, Fill::ids}}, {}},
          {"1 sequence of 4 pages of 3", {{{5, 1, 3, 2}}, {{1, 4}, Fill::ids}}, {}}};
}

// Tables of 5 rows: the ids fill (-1 to 6) picks some rows twice and some ids outside the table.
std::vector<OpCase> embedding() {
  return {{"ids 2x3, rows of 4", {{{2, 3}, Fill::ids}, {{5, 4}}}, {}}, {"ids 7, rows of 2x3", {{{7}, Fill::ids}, {{5, 2, 3}}}, {}}};
}

std::vector<OpCase> log_softmax() { return {{"last axis", {{{4, 9}}}, axis(-1)}, {"first axis", {{{6, 3}}}, axis(0)}}; }

std::vector<OpCase> reduce_mean() { return {{"last axis", {{{3, 33}}}, axis(1)}, {"middle no keepdim", {{{2, 7, 3}}}, axis(1, false)}}; }

std::vector<OpCase> where() {
  return {{"same", {{{3, 4}, Fill::boolean}, {{3, 4}}, {{3, 4}}}, {}}, {"broadcast mask", {{{4, 5}, Fill::boolean}, {{2, 4, 5}}, {{}}}, {}}};
}

std::vector<OpCase> reduce() {
  return {{"last axis", {{{3, 33}}}, axis(1)}, {"first axis", {{{5, 4}}}, axis(0)}, {"middle no keepdim", {{{2, 7, 3}}}, axis(1, false)}};
}

std::vector<OpCase> matmul() {
  return {{"2d", {{{5, 7}}, {{7, 3}}}, {}},
          {"batched", {{{2, 3, 4}}, {{2, 4, 6}}}, {}},
          {"broadcast batch", {{{2, 1, 3, 8}}, {{3, 8, 5}}}, {}},
          {"transpose b", {{{2, 6, 9}}, {{2, 5, 9}}}, transpose(false, true)},
          {"transpose a", {{{9, 6}}, {{9, 5}}}, transpose(true, false)},
          {"transpose both odd", {{{3, 17, 19}}, {{3, 23, 17}}}, transpose(true, true)},
          {"tile edges 33x65x31", {{{33, 65}}, {{65, 31}}}, {}}};
}

std::vector<OpCase> permute() { return {{"2d transpose", {{{3, 5}}}, perm({1, 0})}, {"4d heads", {{{2, 3, 4, 5}}}, perm({0, 2, 1, 3})}}; }

std::vector<OpCase> reshape() { return {{"split", {{{4, 6}}}, shape({2, 2, 6})}, {"flatten", {{{2, 3, 4}}}, shape({24})}}; }

std::vector<OpCase> causal_mask() {
  return {{"square", {{{2, 5, 5}}}, align(CausalAlign::top_left)},
          {"top-left Lq<Lk", {{{3, 6}}}, align(CausalAlign::top_left)},
          {"bottom-right Lq<Lk", {{{3, 6}}}, align(CausalAlign::bottom_right)},
          {"sliding window 3", {{{7, 9}}}, align(CausalAlign::bottom_right, 3)}};
}

std::vector<OpCase> attention() {
  Attrs plain = scaled(0.35);
  Attrs causal = plain;
  causal.causal = true;
  Attrs bottom = causal;
  bottom.align = CausalAlign::bottom_right;
  Attrs window = bottom;
  window.window = 70;
  return {{"batched", {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 6}}}, plain},
          {"causal heads broadcast k v", {{{2, 3, 6, 8}}, {{3, 6, 8}}, {{3, 6, 4}}}, causal},
          {"causal bottom-right Lq<Lk", {{{4, 8}}, {{9, 8}}, {{9, 3}}}, bottom},
          {"long rows", {{{1, 3, 16}}, {{1, 700, 16}}, {{1, 700, 16}}}, plain},
          {"sliding window skips key blocks", {{{1, 300, 8}}, {{1, 640, 8}}, {{1, 640, 4}}}, window}};
}

std::vector<OpCase> masked_attention() {
  Attrs plain = scaled(0.25);
  Attrs causal = plain;
  causal.causal = true;
  return {{"padding mask", {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 8}}, {{2, 1, 7}, Fill::keep_first}}, plain},
          {"full mask causal", {{{6, 4}}, {{6, 4}}, {{6, 2}}, {{6, 6}, Fill::keep_first}}, causal}};
}

std::vector<OpCase> attention_lse() {
  Attrs plain = scaled(0.35);
  Attrs window = plain;
  window.causal = true;
  window.align = CausalAlign::bottom_right;
  window.window = 20;
  return {{"batched", {{{2, 5, 8}}, {{2, 7, 8}}}, plain}, {"sliding window skips key blocks", {{{1, 130, 8}}, {{1, 300, 8}}}, window}};
}

std::vector<OpCase> masked_attention_lse() {
  Attrs causal = scaled(0.25);
  causal.causal = true;
  return {{"padding mask causal", {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 1, 7}, Fill::keep_first}}, causal}};
}

std::vector<OpCase> attention_grad() {
  // (q, k, v, dy, lse, delta): lse and delta are free inputs here, so every term is exercised;
  // lse is positive, so that p = exp(s - lse) stays near 1 as it does in use.
  Attrs a = scaled(0.35);
  auto wrt = [&](int w, bool causal, std::int64_t window = 0) {
    Attrs r = a;
    r.wrt = static_cast<std::int8_t>(w);
    r.causal = causal;
    r.align = window > 0 ? CausalAlign::bottom_right : CausalAlign::top_left;
    r.window = window;
    return r;
  };
  const std::vector<CaseInput> batched = {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 6}}, {{2, 5, 6}}, {{2, 5, 1}, Fill::positive}, {{2, 5, 1}}};
  const std::vector<CaseInput> heads = {{{2, 3, 6, 8}}, {{3, 6, 8}}, {{3, 6, 4}}, {{2, 3, 6, 4}}, {{2, 3, 6, 1}, Fill::positive}, {{2, 3, 6, 1}}};
  const std::vector<CaseInput> window = {{{1, 130, 8}}, {{1, 300, 8}}, {{1, 300, 4}}, {{1, 130, 4}}, {{1, 130, 1}, Fill::positive}, {{1, 130, 1}}};
  return {{"dq batched", batched, wrt(0, false)},
          {"dk batched", batched, wrt(1, false)},
          {"dv batched", batched, wrt(2, false)},
          {"dq causal heads broadcast k v", heads, wrt(0, true)},
          {"dk causal heads broadcast k v", heads, wrt(1, true)},
          {"dv causal heads broadcast k v", heads, wrt(2, true)},
          {"dq sliding window skips blocks", window, wrt(0, true, 20)},
          {"dk sliding window skips blocks", window, wrt(1, true, 20)},
          {"dv sliding window skips blocks", window, wrt(2, true, 20)}};
}

std::vector<OpCase> masked_attention_grad() {
  std::vector<OpCase> r;
  for (int w = 0; w < 3; ++w) {
    Attrs a = scaled(0.25);
    a.wrt = static_cast<std::int8_t>(w);
    a.causal = w == 1;
    r.push_back({std::string("d") + "qkv"[w] + " padding mask" + (a.causal ? " causal" : ""),
                 {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 3}}, {{2, 5, 3}}, {{2, 5, 1}, Fill::positive}, {{2, 5, 1}}, {{2, 1, 7}, Fill::keep_first}},
                 a});
  }
  return r;
}

std::vector<OpCase> flex_attention() {
  Attrs plain = scaled(0.35);
  Attrs causal = plain;
  causal.causal = true;
  Attrs window = causal;
  window.align = CausalAlign::bottom_right;
  window.window = 40;
  return {
      {"softcap", {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 6}}}, plain, modifier(Mod::softcap)},
      {"slopes per head causal", {{{2, 3, 6, 8}}, {{3, 6, 8}}, {{3, 6, 4}}, {{3, 1, 1}, Fill::positive}}, causal, modifier(Mod::slope)},
      {"softcap then bias", {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 6}}, {{2, 5, 7}}}, plain, modifier(Mod::capped_bias)},
      {"document ids, empty rows",
       {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 6}}, {{2, 5, 1}, Fill::segments}, {{2, 1, 7}, Fill::segments}},
       plain,
       modifier(Mod::document)},
      // Long rows train no tensor: a slope's gradient sums ds (kv_idx - q_idx) over 39,000
      // scores, beyond f32's budgets under the random graphs' loss weights.
      {"long rows sliding window softcap", {{{1, 130, 16}}, {{1, 300, 16}}, {{1, 300, 8}}}, window, modifier(Mod::softcap)},
      {"dropout", {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 6}}, {{}, Fill::seed}}, dropout(plain, 0.3), modifier(Mod::none)},
      {"slopes per head causal dropout",
       {{{2, 3, 6, 8}}, {{3, 6, 8}}, {{3, 6, 4}}, {{3, 1, 1}, Fill::positive}, {{}, Fill::seed}},
       dropout(causal, 0.5),
       modifier(Mod::slope)},
      {"long rows sliding window dropout",
       {{{1, 130, 16}}, {{1, 300, 16}}, {{1, 300, 8}}, {{}, Fill::seed}},
       dropout(window, 0.1),
       modifier(Mod::none)},
      // Attention sinks: a logit per head (gpt-oss) or per row, after the modifier's tensors.
      {"sinks per head causal", {{{2, 3, 6, 8}}, {{3, 6, 8}}, {{3, 6, 4}}, {{3, 1, 1}}}, sunk(causal), modifier(Mod::none)},
      {"slopes and sinks per head causal",
       {{{2, 3, 6, 8}}, {{3, 6, 8}}, {{3, 6, 4}}, {{3, 1, 1}, Fill::positive}, {{3, 1, 1}}},
       sunk(causal),
       modifier(Mod::slope)},
      {"document ids, empty rows, a sink per row",
       {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 6}}, {{2, 5, 1}, Fill::segments}, {{2, 1, 7}, Fill::segments}, {{2, 5, 1}}},
       sunk(plain),
       modifier(Mod::document)},
      {"long rows sliding window softcap sinks", {{{1, 130, 16}}, {{1, 300, 16}}, {{1, 300, 8}}, {{1, 1, 1}}}, sunk(window), modifier(Mod::softcap)},
      {"sinks per head dropout",
       {{{2, 3, 6, 8}}, {{3, 6, 8}}, {{3, 6, 4}}, {{3, 1, 1}}, {{}, Fill::seed}},
       sunk(dropout(plain, 0.3)),
       modifier(Mod::none)}};
}

std::vector<OpCase> flex_attention_lse() {
  Attrs causal = scaled(0.35);
  causal.causal = true;
  return {{"softcap causal", {{{2, 5, 8}}, {{2, 7, 8}}}, causal, modifier(Mod::softcap)},
          {"softcap then bias", {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 5, 7}}}, scaled(0.35), modifier(Mod::capped_bias)},
          {"softcap causal sinks per head", {{{2, 3, 5, 8}}, {{3, 7, 8}}, {{3, 1, 1}}}, sunk(causal), modifier(Mod::softcap)}};
}

std::vector<OpCase> flex_attention_grad() {
  // As attention_grad's cases, and the gradients of the modifier's tensors (wrt 3).
  std::vector<OpCase> r;
  const std::vector<CaseInput> heads = {{{2, 3, 6, 8}}, {{3, 6, 8}}, {{3, 6, 4}}, {{2, 3, 6, 4}}, {{2, 3, 6, 1}, Fill::positive}, {{2, 3, 6, 1}}};
  const std::vector<CaseInput> batched = {{{2, 5, 8}}, {{2, 7, 8}}, {{2, 7, 6}}, {{2, 5, 6}}, {{2, 5, 1}, Fill::positive}, {{2, 5, 1}}};
  for (int w = 0; w < 4; ++w) {
    Attrs a = scaled(0.35);
    a.wrt = static_cast<std::int8_t>(w);
    a.causal = w != 1;
    std::vector<CaseInput> slopes = heads, bias = batched;
    slopes.push_back({{3, 1, 1}, Fill::positive});
    bias.push_back({{2, 5, 7}});
    const std::string name = w < 3 ? std::string("d") + "qkv"[w] : std::string("dt0");
    r.push_back({name + " slopes per head" + (a.causal ? " causal" : ""), slopes, a, modifier(Mod::slope)});
    r.push_back({name + " softcap then bias" + (a.causal ? " causal" : ""), bias, a, modifier(Mod::capped_bias)});
  }
  Attrs dq = scaled(0.35);
  std::vector<CaseInput> docs = batched;
  docs.push_back({{2, 5, 1}, Fill::segments});
  docs.push_back({{2, 1, 7}, Fill::segments});
  r.push_back({"dq document ids, empty rows", docs, dq, modifier(Mod::document)});
  for (int w = 0; w < 4; ++w) {  // with dropout: its seed last
    Attrs a = scaled(0.35);
    a.wrt = static_cast<std::int8_t>(w);
    a.causal = w != 1;
    std::vector<CaseInput> bias = batched;
    bias.push_back({{2, 5, 7}});
    bias.push_back({{}, Fill::seed});
    const std::string name = w < 3 ? std::string("d") + "qkv"[w] : std::string("dt0");
    r.push_back({name + " softcap then bias dropout" + (a.causal ? " causal" : ""), bias, dropout(a, 0.2), modifier(Mod::capped_bias)});
  }
  return r;
}

/// Cases of an attention's tangent op: each of the forward's operand lists with the three
/// tangents (shaped as q, k and v) after v.
std::vector<CaseInput> with_tangents(std::vector<CaseInput> forward) {
  forward.insert(forward.begin() + 3, {forward[0].shape, Fill::normal});
  forward.insert(forward.begin() + 4, {forward[1].shape, Fill::normal});
  forward.insert(forward.begin() + 5, {forward[2].shape, Fill::normal});
  return forward;
}

std::vector<OpCase> attention_jvp() {
  std::vector<OpCase> r;
  for (OpCase c : attention()) {
    c.inputs = with_tangents(c.inputs);
    r.push_back(std::move(c));
  }
  return r;
}

std::vector<OpCase> masked_attention_jvp() {
  std::vector<OpCase> r;
  for (OpCase c : masked_attention()) {
    const CaseInput mask = c.inputs.back();
    c.inputs.pop_back();
    c.inputs = with_tangents(c.inputs);
    c.inputs.push_back(mask);
    r.push_back(std::move(c));
  }
  return r;
}

std::vector<OpCase> flex_attention_jvp() {
  // Flex attention's cases but those that repeat another's modifier in another combination.
  const std::set<std::string> taken = {"softcap",
                                       "slopes per head causal",
                                       "document ids, empty rows",
                                       "long rows sliding window softcap",
                                       "dropout",
                                       "document ids, empty rows, a sink per row",
                                       "slopes and sinks per head causal"};
  std::vector<OpCase> r;
  for (OpCase c : flex_attention()) {
    if (!taken.contains(c.label)) continue;
    c.inputs = with_tangents(c.inputs);
    r.push_back(std::move(c));
  }
  return r;
}

std::vector<OpCase> sink_softmax() {
  return {{"a sink per row", {{{4, 9}}, {{4, 1}}}, {}},
          {"a sink per head", {{{2, 3, 5, 7}}, {{3, 1, 1}}}, {}},
          {"one sink, rows of 300", {{{2, 300}}, {{}}}, {}}};
}

std::vector<OpCase> softmax() {
  return {{"last axis", {{{4, 9}}}, axis(-1)}, {"first axis", {{{6, 3}}}, axis(0)}, {"rows of 300", {{{2, 300}}}, axis(1)}};
}

}  // namespace cases

}  // namespace

std::vector<OpCase> op_cases(Op op) {
  switch (op) {
#define QKV_CASES_COLUMN(id, arity, category, attrs, shape_rule, gradient, cost_rule, decomposition, autocast, roles, cases_of, ...) \
  case Op::id: return cases::cases_of;
    QKV_OPS(QKV_CASES_COLUMN)
#undef QKV_CASES_COLUMN
  }
  return {};
}

DType fill_dtype(Fill f) {
  switch (f) {
    case Fill::normal:
    case Fill::positive: return DType::f32;
    case Fill::boolean:
    case Fill::keep_first: return DType::boolean;
    case Fill::ids:
    case Fill::seed:
    case Fill::segments:
    case Fill::slots: return DType::i32;
  }
  return DType::f32;
}

Graph case_graph(Op op, const OpCase& c) {
  Graph g;
  std::vector<ValueId> ins;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    Shape s;
    for (auto d : c.inputs[i].shape) s.push_back(d);
    ins.push_back(g.add_input("x" + std::to_string(i), fill_dtype(c.inputs[i].fill), s));
  }
  ValueId out = 0;
  if (op == Op::input) out = ins.at(0);  // the case's one input, declared like any other
  else out = g.add(op, ins, c.attrs, c.region);
  g.set_output("out", out);
  return g;
}

}  // namespace qkv::ir
