// Mixed precision as PyTorch's autocast: the ops that gain from half precision run in it, the
// ones that lose accuracy in it run in f32, the rest in their operands' widest dtype. And a whole
// model in one half dtype, as PyTorch's model.half().
#include <algorithm>
#include <vector>

#include "ir/passes/passes.hpp"

namespace qkv::ir {

namespace {

/// The operands the op's autocast policy applies to: attention's q, k and v (not a mask, a
/// modifier's tensors or a seed) for the ops that run in the lower dtype, every operand of the others.
std::vector<std::size_t> policy_operands(Op op, std::size_t operands) {
  const AttentionRoles& r = attention_roles(op);
  std::vector<std::size_t> at;
  if (op_info(op).autocast == Autocast::lower && r.attention()) {
    for (int i : {r.q, r.k, r.v})
      if (i >= 0) at.push_back(static_cast<std::size_t>(i));
    return at;
  }
  for (std::size_t i = 0; i < operands; ++i) at.push_back(i);
  return at;
}

}  // namespace

Graph autocast(const Graph& g, DType lower) {
  if (!is_half(lower)) throw UsageError("autocast: the lower dtype is f16 or bf16, not " + std::string(dtype_name(lower)));
  // Attention fused first, so that the whole of it runs in the lower dtype as one op (its softmax
  // inside accumulates in f32 as the fused kernels do) rather than its softmax alone in f32.
  return rebuild(fuse_attention(g), [lower](Graph& out, ValueId, const Node& n, std::span<const ValueId> in) -> ValueId {
    const Autocast policy = op_info(n.op).autocast;
    if (policy == Autocast::keep || in.empty()) return -1;
    const std::vector<std::size_t> operands = policy_operands(n.op, in.size());
    auto is_tensor = [&](ValueId v) { return is_float(out.node(v).dtype) && out.node(v).shape.rank > 0; };
    DType want = lower;
    switch (policy) {
      case Autocast::keep:
      case Autocast::lower: break;
      case Autocast::f32: want = DType::f32; break;
      case Autocast::promote: {
        // The widest float dtype among the tensor operands (f32 over f16 and bf16; f16 and bf16
        // together promote to f32, as torch's do).
        bool any_f32 = false, any_f16 = false, any_bf16 = false;
        for (std::size_t i : operands)
          if (is_tensor(in[i])) {
            const DType d = out.node(in[i]).dtype;
            any_f32 |= d == DType::f32;
            any_f16 |= d == DType::f16;
            any_bf16 |= d == DType::bf16;
          }
        if (any_f32 + any_f16 + any_bf16 < 2) return -1;  // one dtype (or none): as it is
        want = DType::f32;
        break;
      }
    }
    std::vector<ValueId> ops(in.begin(), in.end());
    bool changed = false;
    for (std::size_t i : operands) {
      if (!is_tensor(ops[i]) || out.node(ops[i]).dtype == want) continue;
      ops[i] = out.cast(ops[i], want);
      changed = true;
    }
    return changed ? out.add(n.op, std::move(ops), n.attrs, n.region) : -1;
  });
}

Graph to_dtype(const Graph& g, DType dtype) {
  if (dtype == DType::f32) return g;
  if (!is_half(dtype)) throw UsageError("to_dtype: a model runs in f32, f16 or bf16, not " + std::string(dtype_name(dtype)));
  return rebuild(g, [dtype](Graph& out, ValueId, const Node& n, std::span<const ValueId> in) -> ValueId {
    if (n.op == Op::input) return n.dtype == DType::f32 ? out.add_input(n.name, dtype, n.shape) : -1;
    // A scalar constant stays f32, as a Python scalar in PyTorch: an op takes it in the tensors'
    // dtype, computing with its full value (an attention's scale stays its scale attribute).
    if (n.op == Op::constant && n.shape.rank == 0) return -1;
    const ValueId v = out.add(n.op, {in.begin(), in.end()}, n.attrs, n.region);
    return out.node(v).dtype == DType::f32 && out.node(v).shape.rank > 0 ? out.cast(v, dtype) : v;
  });
}

Graph store_inputs_as(const Graph& g, const std::map<std::string, DType, std::less<>>& dtypes) {
  std::map<std::string, DType, std::less<>> declared_as;
  for (const ValueId v : g.inputs()) declared_as.emplace(g.node(v).name, g.node(v).dtype);
  for (const auto& [name, dtype] : dtypes) {
    auto found = declared_as.find(name);
    if (found == declared_as.end()) throw UsageError("store_inputs_as: the graph has no input '" + name + "'");
    const DType declared = found->second;
    if (dtype != declared && (declared != DType::f32 || !is_half(dtype)))
      throw UsageError("store_inputs_as: input '" + name + "' is " + std::string(dtype_name(declared)) +
                       "; only f32 inputs are stored in f16 or bf16, not " + std::string(dtype_name(dtype)));
  }
  return rebuild(g, [&](Graph& out, ValueId, const Node& n, std::span<const ValueId>) -> ValueId {
    if (n.op != Op::input) return -1;
    auto it = dtypes.find(n.name);
    if (it == dtypes.end() || it->second == n.dtype) return -1;
    return out.cast(out.add_input(n.name, it->second, n.shape), DType::f32);
  });
}

}  // namespace qkv::ir
