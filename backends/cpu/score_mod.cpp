// The score modifier interpreter: each region node is one loop over a row of scores.
#include "backends/cpu/score_mod.hpp"

#include <algorithm>

#include "backends/scalar_ops.hpp"
#include "ir/error.hpp"
#include "ir/region.hpp"

namespace qkv::backend::cpu {

ScoreModifier::ScoreModifier(const ir::Graph& region, bool derivative, std::vector<ConstView> tensors, const ir::Shape& batch,
                             std::int64_t n, std::int64_t m)
    : batch_(batch) {
  // With the derivative, the forward-mode graph holds the modifier's own nodes too: one program
  // computes both.
  const ir::Graph program = derivative ? ir::differentiate_region(region, ir::kRegionScore, true) : region;
  for (const ir::Node& node : program.nodes()) {
    Step st{node.op};
    if (node.op == ir::Op::input) st.input = static_cast<int>(steps_.size());  // inputs come first, in order
    if (node.op == ir::Op::constant) st.value = static_cast<float>(node.attrs.value);
    if (!node.inputs.empty()) st.a = node.inputs[0];
    if (node.inputs.size() > 1) st.b = node.inputs[1];
    if (node.inputs.size() > 2) st.c = node.inputs[2];
    steps_.push_back(st);
  }
  if (derivative) {
    mod_ = program.output("primal");
    dmod_ = program.output("mod");
  } else {
    mod_ = program.output("mod");
  }
  ir::Shape scores = batch;
  scores.push_back(n);
  scores.push_back(m);
  for (const ConstView& t : tensors) {
    const Strides full = broadcast_strides(t.shape, scores);
    Operand o{t.data, {}, full[static_cast<std::size_t>(scores.rank - 2)], full[static_cast<std::size_t>(scores.rank - 1)]};
    for (int i = 0; i < batch.rank; ++i) o.batch[static_cast<std::size_t>(i)] = full[static_cast<std::size_t>(i)];
    tensors_.push_back(o);
  }
}

void ScoreModifier::apply_row(std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t cols, float* s, float* dmod) const {
  thread_local std::vector<float> scratch;
  const std::size_t need = steps_.size() * static_cast<std::size_t>(cols);
  if (scratch.size() < need) scratch.resize(need);
  auto reg = [&](int r) { return scratch.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(cols); };
  for (std::size_t k = 0; k < steps_.size(); ++k) {
    const Step& st = steps_[k];
    float* out = reg(static_cast<int>(k));
    switch (st.op) {
      case ir::Op::input:
        if (st.input == ir::kRegionScore) std::copy_n(s, cols, out);
        else if (st.input == ir::kRegionQIdx) std::fill_n(out, cols, static_cast<float>(i));
        else if (st.input == ir::kRegionKvIdx) for (std::int64_t j = 0; j < cols; ++j) out[j] = static_cast<float>(j0 + j);
        else {
          const Operand& t = tensors_[static_cast<std::size_t>(st.input - ir::kRegionFixedInputs)];
          std::int64_t off = 0, rest = b;
          for (int d = batch_.rank - 1; d >= 0; --d) {
            off += (rest % batch_[d]) * t.batch[static_cast<std::size_t>(d)];
            rest /= batch_[d];
          }
          const float* row = t.data + off + i * t.row + j0 * t.col;
          if (t.col == 0) std::fill_n(out, cols, row[0]);
          else for (std::int64_t j = 0; j < cols; ++j) out[j] = row[j * t.col];
        }
        break;
      case ir::Op::constant: std::fill_n(out, cols, st.value); break;
      case ir::Op::neg:
      case ir::Op::exp:
      case ir::Op::log:
      case ir::Op::sqrt:
      case ir::Op::tanh:
      case ir::Op::erf:
      case ir::Op::sin:
      case ir::Op::cos:
      case ir::Op::cast: unary(st.op, ConstView{reg(st.a), {cols}}, View{out, {cols}}); break;
      case ir::Op::add:
      case ir::Op::sub:
      case ir::Op::mul:
      case ir::Op::div:
      case ir::Op::max:
      case ir::Op::equal:
      case ir::Op::greater: binary(st.op, ConstView{reg(st.a), {cols}}, ConstView{reg(st.b), {cols}}, View{out, {cols}}); break;
      case ir::Op::where: {
        const float *c = reg(st.a), *x = reg(st.b), *y = reg(st.c);
        for (std::int64_t j = 0; j < cols; ++j) out[j] = c[j] != 0.0f ? x[j] : y[j];
        break;
      }
      default: QKV_UNREACHABLE(std::string(ir::op_name(st.op)) + " in a score modifier");
    }
  }
  std::copy_n(reg(mod_), cols, s);
  if (dmod && dmod_ >= 0) std::copy_n(reg(dmod_), cols, dmod);
}

}  // namespace qkv::backend::cpu
