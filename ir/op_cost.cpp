// Estimated floating-point work, one case per op.
#include "ir/op_cost.hpp"

namespace qkv::ir {

double estimated_flops(const Node& n, std::span<const Shape> in, const Shape& out) {
  const double elements = static_cast<double>(out.numel());
  switch (n.op) {
    QKV_SOURCE_CASES
    QKV_LAYOUT_CASES
    QKV_MASK_CASES
    case Op::cast: return 0.0;
    QKV_UNARY_CASES
    QKV_BINARY_CASES
    QKV_COMPARE_CASES
    case Op::where: return elements;
    QKV_REDUCE_CASES
    case Op::reduce_mean: return static_cast<double>(in[0].numel());
    case Op::softmax:
    case Op::log_softmax: return 5.0 * elements;
    case Op::matmul: return 2.0 * elements * static_cast<double>(n.attrs.transpose_a ? in[0].back(1) : in[0].back(0));
    case Op::attention:
    case Op::masked_attention: {
      // q kT and weights @ v: 2 N M (D + Dv) per batch entry; causal masking skips about half.
      const double d = static_cast<double>(in[0].back(0)), m = static_cast<double>(in[1].back(1)), dv = static_cast<double>(in[2].back(0));
      return elements / dv * m * 2.0 * (d + dv) / (n.attrs.causal ? 2.0 : 1.0);
    }
    case Op::attention_lse:
    case Op::masked_attention_lse: {
      // q kT: 2 N M D per batch entry.
      const double d = static_cast<double>(in[0].back(0)), m = static_cast<double>(in[1].back(1));
      return elements * m * 2.0 * d / (n.attrs.causal ? 2.0 : 1.0);
    }
    case Op::flex_attention: {
      // attention's, and the modifier's ops on each of the N M scores.
      const double d = static_cast<double>(in[0].back(0)), m = static_cast<double>(in[1].back(1)), dv = static_cast<double>(in[2].back(0));
      const double mod = static_cast<double>(n.region->size());
      return elements / dv * m * (2.0 * (d + dv) + mod) / (n.attrs.causal ? 2.0 : 1.0);
    }
    case Op::flex_attention_lse: {
      const double d = static_cast<double>(in[0].back(0)), m = static_cast<double>(in[1].back(1));
      return elements * m * (2.0 * d + static_cast<double>(n.region->size())) / (n.attrs.causal ? 2.0 : 1.0);
    }
    case Op::flex_attention_grad: {
      // attention_grad's, the modifier and its derivative on each score; a tensor's gradient
      // (wrt >= 3) recomputes the scores and dy vT.
      const Shape& q = in[0];
      const double nq = static_cast<double>(q.back(1)), d = static_cast<double>(q.back(0)),
                   m = static_cast<double>(in[1].back(1)), dv = static_cast<double>(in[2].back(0));
      const double batches = n.attrs.wrt >= 3 ? elements / (nq * m) : elements / static_cast<double>(out.back(0) * out.back(1));
      const double per = n.attrs.wrt == 2 ? d + dv : n.attrs.wrt >= 3 ? d + dv : 2.0 * d + dv;
      return batches * nq * m * (2.0 * per + 3.0 * static_cast<double>(n.region->size())) / (n.attrs.causal ? 2.0 : 1.0);
    }
    case Op::attention_grad:
    case Op::masked_attention_grad: {
      // Recomputing q kT, then pT dy (dv), or dy vT and ds k or dsT q (dq, dk): per batch entry
      // 2 N M (D + Dv) for dv, 2 N M (2 D + Dv) for dq and dk.
      const Shape& q = in[0];
      const double nq = static_cast<double>(q.back(1)), d = static_cast<double>(q.back(0)),
                   m = static_cast<double>(in[1].back(1)), dv = static_cast<double>(in[2].back(0));
      const double batches = elements / static_cast<double>(out.back(0) * out.back(1));
      const double per = n.attrs.wrt == 2 ? d + dv : 2.0 * d + dv;
      return batches * 2.0 * nq * m * per / (n.attrs.causal ? 2.0 : 1.0);
    }
  }
  return 0.0;
}

double estimated_flops(const Graph& g, ValueId v, const std::vector<Shape>& shapes) {
  const Node& n = g.node(v);
  std::vector<Shape> in;
  for (ValueId operand : n.inputs) in.push_back(shapes[static_cast<std::size_t>(operand)]);
  return estimated_flops(n, in, shapes[static_cast<std::size_t>(v)]);
}

}  // namespace qkv::ir
