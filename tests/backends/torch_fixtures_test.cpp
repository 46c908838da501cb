// Every backend against PyTorch 1.13: fixtures written by tests/fixtures/make_torch_fixtures.py
// (inputs, parameters under torch's state_dict names, outputs, and gradients of sum(out * dout)).
// PyTorch's numbers must lie within the float64 reference's error budget (so qkv computes what
// torch computes), and each backend within twice that budget of PyTorch's.
#include <gtest/gtest.h>

#include <filesystem>

#include "backends/equivalence.hpp"
#include "backends/reference/reference_backend.hpp"
#include "dsl/dsl.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "ir/passes/passes.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

struct Fixture {
  backend::TensorMap inputs;    // what the graph reads
  backend::TensorMap expected;  // torch's results for the graph's outputs
};

/// The fixture folder's tensors split into the graph's inputs and the expected values of its outputs.
/// A folder of .npy files, or (for a bf16 case, which NumPy cannot hold) NAME.safetensors with
/// every tensor in torch's dtype.
Fixture load(const std::string& name, const ir::Graph& g) {
  const std::filesystem::path dir = std::filesystem::path(QKV_SOURCE_DIR) / "tests/fixtures/torch" / name;
  backend::TensorMap all;
  if (std::filesystem::exists(dir.string() + ".safetensors") && !std::filesystem::exists(dir)) {
    for (auto& [tensor, value] : io::read_safetensors(dir.string() + ".safetensors")) all.emplace(tensor, std::move(value));
  } else {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) all.emplace(entry.path().stem().string(), io::read_npy(entry.path().string()));
  }
  Fixture f;
  for (ir::ValueId v : g.inputs()) f.inputs.emplace(g.node(v).name, all.at(g.node(v).name));
  for (const auto& [out, v] : g.outputs()) {
    auto it = all.find(out);
    if (it == all.end()) throw std::runtime_error("fixture " + name + " has no " + out);
    f.expected.emplace(out, it->second);
  }
  return f;
}

void expect_matches_torch(const ir::Graph& g, const std::string& fixture, const std::string& backend_name) {
  QKV_GET_BACKEND_OR_SKIP(b, backend_name);
  Fixture f = load(fixture, g);
  auto oracle = backend::make_reference_backend({backend::Precision::f64, true})->compile(g)->run(f.inputs);
  auto plain = backend::make_reference_backend({backend::Precision::f32, true})->compile(g)->run(f.inputs);
  auto got = b->compile(g)->run(f.inputs);
  for (const auto& [out, torch_value] : f.expected) {
    auto torch_vs_f64 = backend::compare_output(out, torch_value, oracle.at(out), plain.at(out), backend::kDefaultBudgetFactor, nullptr,
                                                backend::computed_in(g, out));
    EXPECT_TRUE(torch_vs_f64.pass) << fixture << ": torch's " << out << " is " << torch_vs_f64.max_abs_error << " from the float64 reference, budget "
                                   << torch_vs_f64.budget;
    double worst = 0;
    for (std::int64_t i = 0; i < torch_value.numel(); ++i) worst = std::max(worst, std::abs(got.at(out).at(i) - torch_value.at(i)));
    EXPECT_LE(worst, 2 * torch_vs_f64.budget) << fixture << ": " << backend_name << "'s " << out << " vs torch";
  }
}

class Torch : public ::testing::TestWithParam<std::string> {};

/// The sdpa fixtures' graph: softmax(q kT / sqrt(8), mask) v, with its weights unless `out_only`.
ir::Graph sdpa_model(bool out_only) {
  auto q = input<"q">(dim<2>, dim<5>, dim<8>);
  auto k = input<"k">(dim<2>, dim<7>, dim<8>);
  auto v = input<"v">(dim<2>, dim<7>, dim<4>);
  auto mask = input<"mask", DType::boolean>(dim<5>, dim<7>);
  auto w = attention_weights(q, k, mask);
  return out_only ? lower(named<"out">(matmul(w, v))) : lower(named<"out">(matmul(w, v)), named<"weights">(w));
}

TEST_P(Torch, ScaledDotProductAttention) {
  expect_matches_torch(sdpa_model(false), "sdpa", GetParam());
  expect_matches_torch(ir::build_backward(sdpa_model(true), {"", {"q", "k", "v"}, {"out"}}), "sdpa", GetParam());
}

TEST_P(Torch, MultiheadAttentionWithMasksAndWeights) {
  auto query = input<"query">(dim<2>, dim<5>, dim<16>);
  auto memory = input<"memory">(dim<2>, dim<7>, dim<16>);
  auto attn_mask = input<"attn_mask", DType::boolean>(dim<5>, dim<7>);
  auto kpm = input<"key_padding_mask", DType::boolean>(dim<2>, dim<7>);
  auto r = multi_head_attention<4>(query, memory, memory, mha_params<"", 16>(), attn_mask_bias(attn_mask), key_padding_bias(kpm));
  ir::Graph g = lower(named<"out">(r.output), named<"weights">(mean_over_heads(r.weights)), named<"weights_per_head">(r.weights));
  expect_matches_torch(g, "mha", GetParam());
  expect_matches_torch(ir::build_backward(lower(named<"out">(r.output)),
                                          {"", {"query", "memory", "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}, {"out"}}),
                       "mha", GetParam());
}

TEST_P(Torch, MultiheadAttentionWithKdimAndVdim) {
  auto query = input<"query">(dim<2>, dim<4>, dim<16>);
  auto key = input<"key">(dim<2>, dim<3>, dim<6>);
  auto value = input<"value">(dim<2>, dim<3>, dim<5>);
  auto r = multi_head_attention<2>(query, key, value, mha_params_kv<"", 16, 6, 5>());
  expect_matches_torch(lower(named<"out">(r.output), named<"weights">(mean_over_heads(r.weights))), "mha_kdim_vdim", GetParam());
  expect_matches_torch(ir::build_backward(lower(named<"out">(r.output)), {"",
                                                                          {"query", "key", "value", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                                                                           "in_proj_bias", "out_proj.weight", "out_proj.bias"},
                                                                          {"out"}}),
                       "mha_kdim_vdim", GetParam());
}

std::vector<std::string> parameter_names(const ir::Graph& g, std::initializer_list<std::string> data) {
  std::vector<std::string> names(data);
  for (ir::ValueId v : g.inputs())
    if (std::find(names.begin(), names.end(), g.node(v).name) == names.end()) names.push_back(g.node(v).name);
  return names;
}

/// The decoder_block fixtures' graph: a pre-norm block with causal self-attention and GELU.
ir::Graph decoder_block_model() {
  auto x = input<"x">(dim<2>, dim<6>, dim<16>);
  return lower(named<"out">(decoder_block<"", 16, 2, 32, Activation::gelu>(x)));
}

TEST_P(Torch, PreNormDecoderBlockIsTransformerEncoderLayerWithACausalMask) {
  const ir::Graph g = decoder_block_model();
  expect_matches_torch(g, "decoder_block", GetParam());
  expect_matches_torch(ir::build_backward(g, {"", parameter_names(g, {"x"}), {"out"}}), "decoder_block", GetParam());
}

TEST_P(Torch, EncoderDecoderBlockIsTransformerDecoderLayer) {
  auto tgt = input<"tgt">(dim<2>, dim<5>, dim<16>);
  auto memory = input<"memory">(dim<2>, dim<7>, dim<16>);
  ir::Graph g = lower(named<"out">(encoder_decoder_block<"", 16, 2, 32>(tgt, memory)));
  expect_matches_torch(g, "encoder_decoder_block", GetParam());
  expect_matches_torch(ir::build_backward(g, {"", parameter_names(g, {"tgt", "memory"}), {"out"}}), "encoder_decoder_block", GetParam());
}

TEST_P(Torch, LayerNormGeluAndCrossEntropy) {
  auto x = input<"x">(dim<3>, dim<4>, dim<10>);
  auto logits = input<"logits">(dim<4>, dim<6>, dim<10>);
  auto targets = input<"targets", DType::i32>(dim<4>, dim<6>);
  ir::Graph g = lower(named<"layer_norm">(layer_norm(x, input<"weight">(dim<10>), input<"bias">(dim<10>))), named<"gelu">(gelu(x)),
                      named<"gelu_tanh">(gelu_tanh(x)), named<"cross_entropy">(cross_entropy(logits, targets)));
  expect_matches_torch(g, "functions", GetParam());
  expect_matches_torch(ir::build_backward(g, {"", {"x", "weight", "bias", "logits"}, {"layer_norm", "gelu", "gelu_tanh", "cross_entropy"}}),
                       "functions", GetParam());
}

/// Score modifiers as torch users write them out (make_torch_fixtures.py: soft-capping, ALiBi's
/// slope_h * (j - i), a causal document mask from ids), written with the attention library's
/// options; on cpu and vulkan each runs as one fused flex attention forward and backward.
TEST_P(Torch, FlexModifiersWrittenAsTorchUsersWriteThem) {
  auto flex_only = [&](const ir::Graph& g) {
    if (GetParam() == "reference") return;
    QKV_GET_BACKEND_OR_SKIP(b, GetParam());
    auto exe = b->compile(g);
    int flex = 0;
    for (const ir::Node& n : exe->graph().nodes()) {
      EXPECT_NE(n.op, ir::Op::softmax);
      flex += n.op == ir::Op::flex_attention;
    }
    EXPECT_EQ(flex, 1);
  };
  auto check = [&](const ir::Graph& forward, const std::string& fixture) {
    SCOPED_TRACE(fixture);
    ir::Graph backward = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
    expect_matches_torch(forward, fixture, GetParam());
    expect_matches_torch(backward, fixture, GetParam());
    flex_only(backward);
  };
  {
    auto q = input<"q">(dim<2>, dim<3>, dim<6>, dim<8>);
    auto k = input<"k">(dim<2>, dim<3>, dim<6>, dim<8>);
    auto v = input<"v">(dim<2>, dim<3>, dim<6>, dim<4>);
    check(lower(named<"out">(scaled_dot_product_attention(q, k, v, softcap_scores(2.0), causal))), "flex_softcap");
  }
  {
    auto q = input<"q">(dim<2>, dim<4>, dim<7>, dim<8>);
    auto k = input<"k">(dim<2>, dim<4>, dim<7>, dim<8>);
    auto v = input<"v">(dim<2>, dim<4>, dim<7>, dim<8>);
    check(lower(named<"out">(scaled_dot_product_attention(q, k, v, causal, alibi_bias<4>(k)))), "flex_alibi");
  }
  {
    auto q = input<"q">(dim<2>, dim<2>, dim<8>, dim<8>);
    auto k = input<"k">(dim<2>, dim<2>, dim<8>, dim<8>);
    auto v = input<"v">(dim<2>, dim<2>, dim<8>, dim<4>);
    auto docs = input<"docs", DType::i32>(dim<2>, dim<8>);
    check(lower(named<"out">(scaled_dot_product_attention(q, k, v, document_mask(docs, docs), causal))), "flex_document");
  }
}

/// A packed batch masked as torch users mask one (a block-diagonal causal mask from the offsets,
/// keys of their own lengths): varlen(cu_q, cu_k) with causality within each sequence, one fused
/// flex attention on cpu and vulkan.
TEST_P(Torch, VarlenWrittenAsABlockDiagonalMask) {
  auto q = input<"q">(dim<2>, dim<12>, dim<8>);
  auto k = input<"k">(dim<2>, dim<13>, dim<8>);
  auto v = input<"v">(dim<2>, dim<13>, dim<4>);
  auto cu_q = input<"cu_q", DType::i32>(dim<4>);
  auto cu_k = input<"cu_k", DType::i32>(dim<4>);
  const ir::Graph forward = lower(named<"out">(scaled_dot_product_attention(q, k, v, varlen(cu_q, cu_k), causal_bottom_right)));
  const ir::Graph backward = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
  expect_matches_torch(forward, "flex_varlen", GetParam());
  expect_matches_torch(backward, "flex_varlen", GetParam());
  if (GetParam() == "reference") return;
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  const auto exe = b->compile(backward);
  int flex = 0;
  for (const ir::Node& n : exe->graph().nodes()) flex += n.op == ir::Op::flex_attention;
  EXPECT_EQ(flex, 1);
}

/// Attention sinks as gpt-oss's torch reference writes them (a column of per-head sink logits
/// appended to the scores, the softmax, the column dropped), with its sliding window: the sinks
/// option, one fused flex attention on cpu and vulkan, and the sinks' gradient.
TEST_P(Torch, SinksWrittenAsGptOssWritesThem) {
  auto q = input<"q">(dim<2>, dim<4>, dim<6>, dim<8>);
  auto k = input<"k">(dim<2>, dim<4>, dim<9>, dim<8>);
  auto v = input<"v">(dim<2>, dim<4>, dim<9>, dim<4>);
  auto s = input<"sinks">(dim<4>);
  const ir::Graph forward = lower(named<"out">(scaled_dot_product_attention(q, k, v, sliding_window<4>, sinks(s))));
  const ir::Graph backward = ir::build_backward(forward, {"", {"q", "k", "v", "sinks"}, {"out"}});
  expect_matches_torch(forward, "flex_sinks", GetParam());
  expect_matches_torch(backward, "flex_sinks", GetParam());
  if (GetParam() == "reference") return;
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  int sunk = 0;
  const auto exe = b->compile(backward);
  for (const ir::Node& n : exe->graph().nodes()) {
    EXPECT_NE(n.op, ir::Op::sink_softmax);
    sunk += n.op == ir::Op::flex_attention && n.attrs.sink;
  }
  EXPECT_EQ(sunk, 1);
}

/// Forward mode against torch.func.jvp (torch 2.15): causal SDPA, and attention with soft-capping,
/// a sliding window and sinks written out as torch users write them; on cpu one fused tangent
/// kernel (attention_jvp) that also computes the output, on vulkan the tangent's flash kernel.
TEST_P(Torch, ForwardModeMatchesTorchFuncJvp) {
  auto q = input<"q">(dim<2>, dim<3>, dim<9>, dim<8>);
  auto k = input<"k">(dim<2>, dim<3>, dim<9>, dim<8>);
  auto v = input<"v">(dim<2>, dim<3>, dim<9>, dim<4>);
  const ir::Graph sdpa = ir::build_jvp(lower(named<"out">(scaled_dot_product_attention(q, k, v, causal))), {{"q", "k", "v"}, {}});
  expect_matches_torch(sdpa, "jvp_sdpa", GetParam());
  auto fq = input<"q">(dim<2>, dim<4>, dim<6>, dim<8>);
  auto fk = input<"k">(dim<2>, dim<4>, dim<9>, dim<8>);
  auto fv = input<"v">(dim<2>, dim<4>, dim<9>, dim<4>);
  auto s = input<"sinks">(dim<4>);
  const ir::Graph flex = ir::build_jvp(
      lower(named<"out">(scaled_dot_product_attention(fq, fk, fv, softcap_scores(5.0), sliding_window<4>, sinks(s)))), {{"q", "k", "v"}, {}});
  expect_matches_torch(flex, "jvp_flex", GetParam());
  if (GetParam() != "cpu") return;
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  for (const ir::Graph* g : {&sdpa, &flex}) {
    int tangents = 0;
    const auto exe = b->compile(*g);
    for (const ir::Node& n : exe->graph().nodes()) tangents += ir::attention_roles(n.op).jvp() ? 1 : 0;
    EXPECT_EQ(tangents, 1);
  }
}

// The same models in bf16 and f16 (every float value, as torch's module.to(dtype)), against
// torch 1.13 on the CPU: forward and backward within the budgets of the float64 reference
// rounding where qkv rounds (torch rounds at its own points, within them). torch 1.13 has no f16
// kernels on the CPU for matmuls, softmax, layer_norm and gelu: the f16 fixtures ran those ops
// (and their backwards) on operands widened to f32 with the result rounded to f16 by torch, as
// its f16 kernels do (make_torch_fixtures.py's F16Kernels).
const std::vector<std::pair<DType, std::string>> kHalfFixtures{{DType::bf16, "bf16"}, {DType::f16, "f16"}};

TEST_P(Torch, HalfScaledDotProductAttention) {
  for (const auto& [dtype, suffix] : kHalfFixtures) {
    SCOPED_TRACE(suffix);
    expect_matches_torch(ir::to_dtype(sdpa_model(false), dtype), "sdpa_" + suffix, GetParam());
    expect_matches_torch(ir::build_backward(ir::to_dtype(sdpa_model(true), dtype), {"", {"q", "k", "v"}, {"out"}}), "sdpa_" + suffix, GetParam());
  }
}

TEST_P(Torch, HalfMultiheadAttention) {
  auto query = input<"query">(dim<2>, dim<5>, dim<16>);
  auto memory = input<"memory">(dim<2>, dim<7>, dim<16>);
  auto r = multi_head_attention<4>(query, memory, memory, mha_params<"", 16>());
  for (const auto& [dtype, suffix] : kHalfFixtures) {
    SCOPED_TRACE(suffix);
    const ir::Graph g = ir::to_dtype(lower(named<"out">(r.output), named<"weights">(mean_over_heads(r.weights))), dtype);
    expect_matches_torch(g, "mha_" + suffix, GetParam());
    const ir::Graph out = ir::to_dtype(lower(named<"out">(r.output)), dtype);
    expect_matches_torch(ir::build_backward(out, {"", parameter_names(out, {"query", "memory"}), {"out"}}), "mha_" + suffix, GetParam());
  }
}

TEST_P(Torch, HalfPreNormDecoderBlock) {
  for (const auto& [dtype, suffix] : kHalfFixtures) {
    SCOPED_TRACE(suffix);
    const ir::Graph g = ir::to_dtype(decoder_block_model(), dtype);
    expect_matches_torch(g, "decoder_block_" + suffix, GetParam());
    expect_matches_torch(ir::build_backward(g, {"", parameter_names(g, {"x"}), {"out"}}), "decoder_block_" + suffix, GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(All, Torch, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

}  // namespace
}  // namespace qkv
