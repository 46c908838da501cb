// The IR passes, each a pure Graph -> Graph function defined in its own file, and the pipeline
// that runs them in order.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ir/gradients.hpp"
#include "ir/graph.hpp"

namespace qkv::ir {

/// Common subexpression elimination: structurally equal nodes become one (cse.cpp).
Graph eliminate_common_subexpressions(const Graph& g);

/// Dead code elimination: drops nodes no output depends on; inputs always stay (dce.cpp).
Graph eliminate_dead_code(const Graph& g);

/// Sums of zero-padded pieces along one axis (autodiff's gradient of a tensor read through
/// slices) become one concatenation of the pieces: concat(dq, 0) + concat(0, dk) -> concat(dq, dk)
/// (fold_padded_sums.cpp).
Graph fold_padded_sums(const Graph& g);

/// Attention fusion: matmul(softmax(where*(q kT * c)), v), with each intermediate used once, becomes
/// one attention (or masked_attention) node; a where with a causal_mask condition becomes its
/// causal attribute (fuse_attention.cpp). With `keep` (a backend's supports), only the fused
/// nodes it keeps are made: a backend never gets attention fused only to decompose it again.
Graph fuse_attention(const Graph& g, const std::function<bool(const Node&)>& keep = {});

/// Grouped-query attention as rows: an attention or flex_attention forward whose k and v are
/// shared by the G query heads on q's axis -3 gets q [..., G, N, D] as [..., G N, D] and k, v
/// without that axis, so its kernel reads each key/value head once for the group (decoding reads
/// the cache once). Only where no score depends on the query's row (no mask, modifier reading
/// q_idx or a tensor, dropout, or causality but one query's bottom-right), G and N static, and the
/// graph has no attention backward; with `keep` (a backend's supports), only nodes the backend
/// keeps fused, so a backend that decomposes attention (the reference) computes its meaning
/// (group_query_heads.cpp).
Graph group_query_heads(const Graph& g, const std::function<bool(const Node&)>& keep = {});

/// The attention_lse op and operands that belong to attention node `attention` (attention,
/// masked_attention or flex_attention): what the backward asks for and what a backend computes
/// in the same pass. Same attributes (and region) as the attention node.
struct LseCall {
  Op op;                        ///< attention_lse, masked_attention_lse or flex_attention_lse
  std::vector<ValueId> inputs;  ///< its operands: q, k, then the mask or the modifier's tensors
  Attrs attrs;                  ///< the forward's, without dropout (the lse normalises the weights before it)
};
/// The LseCall of `attention`, which must be an attention, masked_attention or flex_attention node.
LseCall lse_of(const Node& attention);

/// Whether node `t` is the tangent (forward mode) of attention node `attention` (attention,
/// masked_attention or flex_attention): its tangent op over the same q, k, v and other operands,
/// attributes and modifier.
bool is_tangent_of(const Node& t, const Node& attention);

/// Moves each attention_lse (attention's backward reads it) to right after the attention node
/// with the same operands and attributes, so a backend can compute both in one pass, and each
/// attention's tangent op (forward mode) likewise, where all its operands come before the
/// attention (lowering may have put rounds of the output between them); the order is otherwise
/// kept (place_attention_lse.cpp).
Graph place_attention_lse(const Graph& g);

/// The graph with only the outputs named in `keep` (in that order) and all its updates; nodes
/// that only dropped outputs needed go too (select_outputs.cpp).
Graph select_outputs(const Graph& g, const std::vector<std::string>& keep);

/// Whether any value of `g` is f16 or bf16.
bool has_half_values(const Graph& g);
/// How a backend takes a half graph's f16 and bf16 inputs: widened to f32 by the caller
/// (declared f32 in the lowered graph), or as they are, each followed by its cast to f32, with
/// the half outputs and the updates of kept inputs cast back to their dtypes (a backend that
/// holds 16-bit values itself).
enum class HalfInputs { widened, kept };

/// `g` with its f16 and bf16 values held in f32, for kernels that compute in f32: half inputs
/// declared f32 (their values are a half type's, exactly) or kept and cast to f32 (`inputs`),
/// each half-typed node computed in f32
/// and its result rounded once (round_f16, round_bf16), casts between floats as those roundings
/// or nothing. PyTorch's semantics: an op on half tensors accumulates and computes in f32 and
/// rounds what it stores. Attention fused before this rounds only its output, as a fused kernel
/// does. Graphs without half values come back unchanged.
Graph emulate_half_precision(const Graph& g, HalfInputs inputs = HalfInputs::widened);

/// Mixed precision as PyTorch's autocast, over a graph written in f32 (autocast.cpp): attention
/// fused, then matmul and attention run in `lower` (f16 or bf16; their f32 operands cast to it);
/// exp, log, softplus, softmax, log_softmax, sums and means run in f32 (half operands cast up);
/// other ops take the widest float dtype among their tensor operands. Inputs keep their dtypes:
/// f32 parameters stay the f32 master copy, and their gradients (through the casts) come out
/// f32. Throws UsageError for a `lower` that is not f16 or bf16.
Graph autocast(const Graph& g, DType lower);
/// `g` with every float value in `dtype` (PyTorch's model.to(dtype)): f32 inputs declared
/// `dtype`, and each tensor an op makes in f32 (a constant, an iota, a cast from i32) cast to
/// `dtype` where it is made; scalar constants stay f32, as PyTorch's Python scalars (an op takes
/// them in its tensors' dtype at their full value). f32 gives `g`; throws UsageError for a dtype other than f16 or bf16.
Graph to_dtype(const Graph& g, DType dtype);
/// `g` with the f32 inputs named in `dtypes` declared in the f16 or bf16 given there, each cast
/// to f32 where it is read: weights stored in 16 bits (a half checkpoint, held as it was saved)
/// and computed with in f32. Backends read such inputs as they are (the cpu's matmul and
/// embedding convert as they stream them). Throws UsageError for a name that is no input, or an
/// input that is not f32 given another dtype.
Graph store_inputs_as(const Graph& g, const std::map<std::string, DType, std::less<>>& dtypes);

/// Replaces each composite node for which `keep` is false with its decomposition
/// (decompose.cpp). Backends keep the composites they implement directly.
Graph decompose_composites(const Graph& g, const std::function<bool(const Node&)>& keep);

/// What a rebuild's rewrite returns to leave a node out of the new graph (nothing kept may read
/// it; its value maps to -1).
inline constexpr ValueId kDropNode = -2;

/// Copies `g` node by node into a new graph through Graph::add (sharing equal nodes).
/// `rewrite(out, id, node, inputs)`, when given, sees each node of `g` (its value id, the node and
/// its inputs as values of `out`) and may emit a replacement for it and return it, return -1 to copy it,
/// or kDropNode to leave it out. With `map`, it holds each value of `g` as a value of the new
/// graph, filled in node order (a rewrite may read the entries of earlier nodes).
Graph rebuild(const Graph& g, const std::function<ValueId(Graph&, ValueId, const Node&, std::span<const ValueId>)>& rewrite = {},
              std::vector<ValueId>* map = nullptr);

/// `g` with its named dims in `sizes` (by name) made those sizes: every shape and attribute that
/// mentions them, and every dim derived from them, is recomputed (a quotient must come out whole),
/// and default scales of dims that became sizes are folded. How a model fixes the sizes it is
/// built for (its heads) and leaves the others to its inputs. Throws ShapeError for a name the
/// graph does not have, a size below 1 or an inexact quotient.
Graph specialize_dims(const Graph& g, const std::map<std::string, std::int64_t>& sizes);

/// What to differentiate: a scalar output `loss` (seeded with 1), and/or outputs in `seeds`, each
/// seeded from a new input named "d" + output ("dout" for "out"); gradients with respect to the
/// float inputs named in `wrt`.
struct GradientSpec {
  std::string loss;                ///< a scalar output seeded with 1, or empty
  std::vector<std::string> wrt;    ///< the float inputs to differentiate with respect to
  std::vector<std::string> seeds;  ///< outputs seeded from new inputs "d" + name
};

/// Reverse-mode autodiff (autodiff.cpp): one graph computing the forward outputs and, for each
/// input x in spec.wrt, an output "d_x" of x's shape. Forward values the rules need are reused,
/// not recomputed; composites whose rule is GradKind::decompose are differentiated through their
/// decompositions; `rules` is the registry's gradient column (replaceable for tests). Throws
/// ShapeError for a bad spec and UnsupportedError naming an op without a rule.
Graph build_backward(const Graph& g, const GradientSpec& spec, const std::function<GradientInfo(Op)>& rules = gradient_info);

/// What forward mode differentiates: the float inputs in `wrt`, each given a tangent as a new
/// input "t_" + name of its dtype and shape, and the outputs in `outputs` (every float output when
/// empty), each given its tangent as a new output "t_" + name.
struct JvpSpec {
  std::vector<std::string> wrt;      ///< the inputs with tangents
  std::vector<std::string> outputs;  ///< the outputs whose tangents are computed; empty: all float ones
};

/// Forward-mode autodiff (jvp.cpp): one graph computing `g`'s outputs and the Jacobian-vector
/// products t_<out> = sum over x of d out / d x . t_<x>, as ordinary IR every backend runs (the
/// tangents' inputs come after g's). Derived exactly from reverse mode (the VJP of the VJP, with
/// the cotangent zero), so every op with a gradient rule or decomposition has one; forward over
/// reverse (the JVP of a backward graph) included. Throws ShapeError for a bad spec (naming the
/// input or output) and UnsupportedError naming an op without a gradient.
Graph build_jvp(const Graph& g, const JvpSpec& spec);

/// Runs the passes a backend's compile runs, in order: fuse attention, emulate half precision
/// (half inputs as `half_inputs` says), decompose, CSE, fold padded sums, DCE, place
/// attention_lse; verifies after each and prints the IR to stderr after each when
/// QKV_PRINT_IR=after-all (pipeline.cpp).
Graph lower_for_backend(const Graph& g, const std::function<bool(const Node&)>& keep_composite, HalfInputs half_inputs = HalfInputs::widened);

}  // namespace qkv::ir
