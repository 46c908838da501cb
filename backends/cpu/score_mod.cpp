// The score modifier interpreter: each region node is one loop over a row of scores.
#include "backends/cpu/score_mod.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <tuple>

#include "backends/cpu/vector_math.hpp"
#include "backends/scalar_ops.hpp"
#include "ir/error.hpp"
#include "ir/region.hpp"

namespace qkv::backend::cpu {

namespace {

/// c when `r` is exactly soft-capping, tanh(score / c) * c (or c * tanh(score / c)) with c > 0 a
/// constant; 0 otherwise.
float softcap_of(const ir::Graph& r) {
  auto constant = [&](ir::ValueId v) { return r.node(v).op == ir::Op::constant ? r.node(v).attrs.value : 0.0; };
  const ir::Node& out = r.node(r.output("mod"));
  if (out.op != ir::Op::mul) return 0;
  for (int side : {0, 1}) {
    const double c = constant(out.inputs[static_cast<std::size_t>(1 - side)]);
    const ir::Node& t = r.node(out.inputs[static_cast<std::size_t>(side)]);
    if (!(c > 0) || t.op != ir::Op::tanh) continue;
    const ir::Node& d = r.node(t.inputs[0]);
    if (d.op == ir::Op::div && d.inputs[0] == ir::kRegionScore && constant(d.inputs[1]) == c) return static_cast<float>(c);
  }
  return 0;
}

}  // namespace

ScoreModifier::ScoreModifier(const ir::Graph& region, bool derivative, std::vector<ConstView> tensors, const ir::Shape& batch, std::int64_t n,
                             std::int64_t m)
    : region_(region), masks_(ir::region_masks(region)), softcap_(softcap_of(region)), batch_(batch) {
  ir::Shape scores = batch;
  scores.push_back(n);
  scores.push_back(m);
  for (const ConstView& t : tensors) {
    const Strides full = broadcast_strides(t.shape, scores);
    Operand o{t.data, {}, full[static_cast<std::size_t>(scores.rank - 2)], full[static_cast<std::size_t>(scores.rank - 1)]};
    for (int i = 0; i < batch.rank; ++i) o.batch[static_cast<std::size_t>(i)] = full[static_cast<std::size_t>(i)];
    tensors_.push_back(o);
  }
  // With the derivative, the forward-mode graph holds the modifier's own nodes too: one program
  // computes both.
  program_ = derivative ? ir::differentiate_region(region, ir::kRegionScore, true) : region;
  const ir::Graph& program = program_;
  for (const ir::Node& node : program.nodes()) {
    Step st{node.op};
    if (node.op == ir::Op::input) st.input = static_cast<int>(steps_.size());  // inputs come first, in order
    if (node.op == ir::Op::constant) st.value = static_cast<float>(node.attrs.value);
    if (!node.inputs.empty()) st.a = node.inputs[0];
    if (node.inputs.size() > 1) st.b = node.inputs[1];
    if (node.inputs.size() > 2) st.c = node.inputs[2];
    // Uniform along a row: constants, the query index, tensors that do not vary with the key,
    // and ops on uniform operands only. They are computed once per row, not once per score.
    if (node.op == ir::Op::constant) st.uniform = true;
    else if (node.op == ir::Op::input)
      st.uniform = st.input == ir::kRegionQIdx ||
                   (st.input >= ir::kRegionFixedInputs && tensors_[static_cast<std::size_t>(st.input - ir::kRegionFixedInputs)].col == 0);
    else {
      st.uniform = true;
      for (int r : {st.a, st.b, st.c})
        if (r >= 0) st.uniform = st.uniform && steps_[static_cast<std::size_t>(r)].uniform;
    }
    steps_.push_back(st);
  }
  if (derivative) {
    mod_ = program.output("primal");
    dmod_ = program.output("mod");
  } else {
    mod_ = program.output("mod");
  }
  // The masking conditions (ir::masking_conditions): every where on one (the derivative's too)
  // is its kept branch when the tile is kept, as ir::unmasked_region has it.
  mask_conds_ = ir::masking_conditions(program_);
  for (Step& st : steps_)
    for (std::size_t c = 0; c < mask_conds_.size(); ++c)
      if (st.op == ir::Op::where && st.a == mask_conds_[c].first) {
        st.kept = mask_conds_[c].second ? st.b : st.c;
        st.cond = static_cast<int>(std::min(c, std::size_t{31}));
      }
  all_kept_ = mask_conds_.empty() ? 0u : mask_conds_.size() >= 32 ? ~0u : (1u << mask_conds_.size()) - 1u;
  // Only the steps the results read run (an unread index or input is not filled per row); where
  // conditions are kept, only those the kept form reads: for every subset of up to kMostPartial
  // conditions, else for none and all.
  auto mark = [&](std::uint32_t kept) {
    std::vector<char> live(steps_.size(), 0);
    live[static_cast<std::size_t>(kept_register(mod_, kept))] = 1;
    if (dmod_ >= 0) live[static_cast<std::size_t>(kept_register(dmod_, kept))] = 1;
    for (std::size_t k = steps_.size(); k-- > 0;) {
      if (!live[k]) continue;
      const Step& st = steps_[k];
      for (int r : {st.a, st.b, st.c})
        if (r >= 0) live[static_cast<std::size_t>(kept_register(r, kept))] = 1;
    }
    live_.push_back(std::move(live));
  };
  if (mask_conds_.size() <= kMostPartial)
    for (std::uint32_t kept = 0; kept <= all_kept_; ++kept) mark(kept);
  else
    for (std::uint32_t kept : {0u, all_kept_}) mark(kept);
  std::vector<std::pair<bool, bool>> varies;
  for (const Operand& t : tensors_) varies.emplace_back(t.row != 0, t.col != 0);
  std::tie(doc_q_, doc_k_) = ir::document_mask_tensors(region_, varies);
  find_diagonals();
}

bool ScoreModifier::masks_result(int c) const {
  // From the result down the kept branches of wheres on masking conditions, each of whose other
  // branch is -inf (a where on such a condition may select something else, a derivative's 0).
  for (int r = mod_;;) {
    const Step& w = steps_[static_cast<std::size_t>(r)];
    if (w.kept < 0) return false;
    const Step& other = steps_[static_cast<std::size_t>(w.kept == w.b ? w.c : w.b)];
    if (other.op != ir::Op::constant || other.value != -std::numeric_limits<float>::infinity()) return false;
    if (w.cond == c) return true;
    r = w.kept;
  }
}

void ScoreModifier::find_diagonals() {
  if (mask_conds_.size() > kMostPartial) return;  // kept forms exist for all conditions or none
  auto tensor = [&](int r) {                      // the tensor step r loads, or -1
    const int input = steps_[static_cast<std::size_t>(r)].input;
    return steps_[static_cast<std::size_t>(r)].op == ir::Op::input && input >= ir::kRegionFixedInputs ? input - ir::kRegionFixedInputs : -1;
  };
  for (std::size_t c = 0; c < mask_conds_.size(); ++c) {
    const auto [cond, keeps_when_true] = mask_conds_[c];
    const Step& st = steps_[static_cast<std::size_t>(cond)];
    if (!keeps_when_true || st.op != ir::Op::greater) continue;
    const int x = tensor(st.a), y = tensor(st.b);
    if (!masks_result(static_cast<int>(c)) || x < 0 || y < 0) continue;
    auto along_queries = [&](int t) { return tensors_[static_cast<std::size_t>(t)].col == 0; };
    auto along_keys = [&](int t) { return tensors_[static_cast<std::size_t>(t)].row == 0; };
    if (along_queries(x) && along_keys(y)) diagonals_.push_back({x, y, true});
    else if (along_keys(x) && along_queries(y)) diagonals_.push_back({y, x, false});
    else continue;
    diagonal_bits_ |= 1u << c;
  }
}

bool ScoreModifier::diagonal_spans(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols, std::int64_t* keep) const {
  if (diagonals_.empty() || cols < 1) return false;
  // Each key tensor over the tile (copied when strided), checked: no NaN, no decrease.
  thread_local std::vector<float> copies;
  copies.resize(static_cast<std::size_t>(cols) * diagonals_.size());
  std::array<const float*, kMostPartial> keys{}, queries{};
  std::array<std::int64_t, kMostPartial> query_strides{};
  for (std::size_t d = 0; d < diagonals_.size(); ++d) {
    const Operand& t = tensors_[static_cast<std::size_t>(diagonals_[d].key)];
    const float* x = t.data + batch_offset(t, b) + j0 * t.col;
    if (t.col != 1) {
      float* to = copies.data() + d * static_cast<std::size_t>(cols);
      for (std::int64_t j = 0; j < cols; ++j) to[j] = x[j * t.col];
      x = to;
    }
    bool ordered = !std::isnan(x[0]);
    for (std::int64_t j = 1; j < cols; ++j) ordered &= x[j] >= x[j - 1];  // false for a NaN too
    if (!ordered) return false;
    keys[d] = x;
    const Operand& q = tensors_[static_cast<std::size_t>(diagonals_[d].query)];
    queries[d] = q.data + batch_offset(q, b) + i0 * q.row;
    query_strides[d] = q.row;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t lo = 0, hi = cols;
    for (std::size_t d = 0; d < diagonals_.size(); ++d) {
      const float q = queries[d][r * query_strides[d]];
      const float* k = keys[d];
      if (std::isnan(q)) {  // greater with a NaN holds nowhere
        hi = 0;
      } else if (diagonals_[d].prefix) {  // keys with k < q
        hi = std::min<std::int64_t>(hi, std::lower_bound(k, k + cols, q) - k);
      } else {  // keys with k > q
        lo = std::max<std::int64_t>(lo, std::upper_bound(k, k + cols, q) - k);
      }
    }
    keep[2 * r] = std::min(lo, hi);
    keep[2 * r + 1] = hi;
  }
  return true;
}

std::optional<ScoreModifier::DocumentIds> ScoreModifier::document_ids(std::int64_t b) const {
  if (doc_q_ < 0) return std::nullopt;
  const Operand &q = tensors_[static_cast<std::size_t>(doc_q_)], &k = tensors_[static_cast<std::size_t>(doc_k_)];
  return DocumentIds{q.data + batch_offset(q, b), q.row, k.data + batch_offset(k, b), k.col};
}

int ScoreModifier::kept_register(int r, std::uint32_t kept) const {
  while (steps_[static_cast<std::size_t>(r)].kept >= 0 && (kept >> steps_[static_cast<std::size_t>(r)].cond & 1u))
    r = steps_[static_cast<std::size_t>(r)].kept;
  return r;
}

std::int64_t ScoreModifier::batch_offset(const Operand& t, std::int64_t b) const {
  std::int64_t off = 0;
  for (int d = batch_.rank - 1; d >= 0; --d) {
    off += (b % batch_[d]) * t.batch[static_cast<std::size_t>(d)];
    b /= batch_[d];
  }
  return off;
}

const std::vector<ir::ValueRange>& ScoreModifier::tile_inputs(ir::ValueRange score, std::int64_t b, std::int64_t i0, std::int64_t rows,
                                                              std::int64_t j0, std::int64_t cols) const {
  thread_local std::vector<ir::ValueRange> in;
  in.assign(static_cast<std::size_t>(ir::kRegionFixedInputs), ir::ValueRange::unknown());
  in[ir::kRegionScore] = score;
  in[ir::kRegionQIdx] = ir::ValueRange::between(static_cast<double>(i0), static_cast<double>(i0 + rows - 1));
  in[ir::kRegionKvIdx] = ir::ValueRange::between(static_cast<double>(j0), static_cast<double>(j0 + cols - 1));
  for (const Operand& t : tensors_) {
    if (t.row != 0 && t.col != 0) {  // score-sized: reading it here would cost as much as the tile
      in.push_back(ir::ValueRange::unknown());
      continue;
    }
    const float* x = t.data + batch_offset(t, b) + i0 * t.row + j0 * t.col;
    const std::int64_t count = t.row != 0 ? rows : t.col != 0 ? cols : 1, stride = t.row + t.col;
    float lo = x[0], hi = x[0];
    bool nan = false;
    for (std::int64_t e = 0; e < count; ++e) {
      const float v = x[e * stride];
      nan |= std::isnan(v);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    in.push_back(nan ? ir::ValueRange::unknown() : ir::ValueRange::between(lo, hi));
  }
  return in;
}

bool ScoreModifier::masks_tile(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) const {
  return masks_ && ir::bound_region(region_, tile_inputs(ir::ValueRange::unknown(), b, i0, rows, j0, cols)).is(-HUGE_VAL);
}

bool ScoreModifier::may_mask_within(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) const {
  const double big = std::numeric_limits<float>::max();
  return masks_ && ir::bound_region(region_, tile_inputs(ir::ValueRange::between(-big, big), b, i0, rows, j0, cols)).lo == -HUGE_VAL;
}

std::uint32_t ScoreModifier::kept_conditions(std::int64_t b, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) const {
  if (mask_conds_.empty()) return 0;
  const std::vector<ir::ValueRange> ranges = ir::bound_region_nodes(program_, tile_inputs(ir::ValueRange::unknown(), b, i0, rows, j0, cols));
  if (mask_conds_.size() > kMostPartial) return ir::conditions_keep(ranges, mask_conds_) ? all_kept_ : 0u;  // all or none
  std::uint32_t kept = 0;
  for (std::size_t c = 0; c < mask_conds_.size(); ++c)
    if (ir::conditions_keep(ranges, std::span(&mask_conds_[c], 1))) kept |= 1u << c;
  return kept;
}

void ScoreModifier::apply_row(std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t cols, float* s, float* dmod, std::uint32_t kept) const {
  if (softcap_ > 0) {  // the common modifier, specialised: one pass instead of three
    softcap_row(s, dmod_ >= 0 ? dmod : nullptr, cols, softcap_);
    return;
  }
  // The score itself where `kept` holds (a mask's tile, its conditions kept or cut): nothing to run.
  if ((!dmod || dmod_ < 0) && kept_register(mod_, kept) == ir::kRegionScore) return;
  // Registers: a row of cols floats for each varying step (the score's is s itself), one float
  // for each uniform step.
  thread_local std::vector<float> scratch, uniform;
  const std::size_t need = steps_.size() * static_cast<std::size_t>(cols);
  if (scratch.size() < need) scratch.resize(need);
  if (uniform.size() < steps_.size()) uniform.resize(steps_.size());
  auto reg = [&](int r) {
    if (r == ir::kRegionScore) return s;
    return scratch.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(cols);
  };
  auto view = [&](int r) {
    const Step& st = steps_[static_cast<std::size_t>(r)];
    return st.uniform ? ConstView{&uniform[static_cast<std::size_t>(r)], {}} : ConstView{reg(r), {cols}};
  };
  auto varies = [&](int r) { return !steps_[static_cast<std::size_t>(r)].uniform; };
  auto u_at = [&](int r) { return uniform[static_cast<std::size_t>(r)]; };
  // Each operand is read through the wheres on the conditions in `kept`.
  auto at = [&](int r) { return r >= 0 && kept ? kept_register(r, kept) : r; };
  const std::vector<char>& live = live_[live_slot(kept)];
  for (std::size_t k = 0; k < steps_.size(); ++k) {
    const Step& st = steps_[k];
    if (!live[k]) continue;
    const int sa = at(st.a), sb = at(st.b), sc = at(st.c);  // the operands' registers
    const int self = static_cast<int>(k);
    float& u = uniform[k];
    float* out = st.uniform ? &u : reg(self);
    switch (ir::op_info(st.op).category) {
      case ir::OpCategory::source:
        if (st.op == ir::Op::constant) {
          u = st.value;
        } else if (st.input == ir::kRegionScore) {
          // s itself
        } else if (st.input == ir::kRegionQIdx) {
          u = static_cast<float>(i);
        } else if (st.input == ir::kRegionKvIdx) {
          for (std::int64_t j = 0; j < cols; ++j) out[j] = static_cast<float>(j0 + j);
        } else {
          const Operand& t = tensors_[static_cast<std::size_t>(st.input - ir::kRegionFixedInputs)];
          const float* row = t.data + batch_offset(t, b) + i * t.row + j0 * t.col;
          if (st.uniform) u = row[0];
          else
            for (std::int64_t j = 0; j < cols; ++j) out[j] = row[j * t.col];
        }
        break;
      case ir::OpCategory::unary:
        if (st.uniform) u = apply_unary(st.op, u_at(sa));
        else unary(st.op, view(sa), View{out, {cols}});
        break;
      case ir::OpCategory::binary:
      case ir::OpCategory::compare:
        if (st.uniform) u = apply_binary(st.op, u_at(sa), u_at(sb));
        else binary_row(st.op, view(sa).data, varies(sa), view(sb).data, varies(sb), out, cols);
        break;
      case ir::OpCategory::select: {
        if (st.uniform) {
          u = u_at(sa) != 0.0f ? u_at(sb) : u_at(sc);
          break;
        }
        const float *c = view(sa).data, *x = view(sb).data, *y = view(sc).data;
        const bool cv = varies(sa), xv = varies(sb), yv = varies(sc);
        for (std::int64_t j = 0; j < cols; ++j) out[j] = c[cv ? j : 0] != 0.0f ? x[xv ? j : 0] : y[yv ? j : 0];
        break;
      }
      case ir::OpCategory::reduce:
      case ir::OpCategory::contract:
      case ir::OpCategory::layout:
      case ir::OpCategory::mask:
      case ir::OpCategory::composite: QKV_UNREACHABLE(std::string(ir::op_name(st.op)) + " in a score modifier");
    }
  }
  // The results, after every step has read s.
  auto result = [&](int r, float* to) {
    if (steps_[static_cast<std::size_t>(r)].uniform) std::fill_n(to, cols, uniform[static_cast<std::size_t>(r)]);
    else if (reg(r) != to) std::copy_n(reg(r), cols, to);
  };
  if (dmod && dmod_ >= 0) result(at(dmod_), dmod);
  result(at(mod_), s);
}

}  // namespace qkv::backend::cpu
