// Attention variants written as expressions, FlexAttention's way: a mask_mod keeps each token
// inside its own document of a packed sequence (and causal), a score_mod adds ALiBi-style
// per-head slopes times the relative position after soft-capping. The backend fuses both into
// one flash kernel (no N x N scores), forward and backward, and skips the tiles a document
// boundary masks whole.
//   example_10_flex_attention [backend]
#include <cmath>
#include <span>

#include <qkv/backends.hpp>
#include <qkv/dsl.hpp>

#include "examples/example.hpp"
#include "ir/region.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  try {
    auto q = input<"q">(dim<1>, dim<2>, dim<"N">, dim<8>);
    auto k = input<"k">(dim<1>, dim<2>, dim<"N">, dim<8>);
    auto v = input<"v">(dim<1>, dim<2>, dim<"N">, dim<8>);
    auto doc = input<"doc", DType::i32>(dim<1>, dim<"N">);
    auto slope = input<"slope">(dim<2>);
    auto same_document = mask_mod([=](auto b, auto, auto q_idx, auto kv_idx) { return at(doc, b, q_idx) == at(doc, b, kv_idx) && kv_idx <= q_idx; });
    auto alibi = score_mod([=](auto score, auto, auto h, auto q_idx, auto kv_idx) { return softcap(score, 20) + slope[h] * (kv_idx - q_idx); });
    auto weights = attention_weights(q, k, same_document, alibi);

    // Eight tokens in three documents: each token attends to its own document's earlier tokens.
    auto in = backend::random_inputs(lower(named<"w">(weights)), {{"N", 8}}, 3);
    const std::int32_t docs[8] = {0, 0, 0, 1, 1, 2, 2, 2};
    for (int i = 0; i < 8; ++i) in.at("doc").data<std::int32_t>()[i] = docs[i];
    in.at("slope").data<float>()[0] = 0.5f;
    in.at("slope").data<float>()[1] = 0.25f;
    auto w = be->compile(lower(named<"w">(weights)))->run(in).at("w");
    example::print_matrix("head 0 weights, documents {0,1,2} {3,4} {5,6,7}:", w, 0);
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j)
        if ((docs[i] != docs[j] || j > i) && w.at(i * 8 + j) != 0.0f) return 1;  // a masked key kept

    // Only the output asked for: one fused node, its modifier a small region, forward and backward.
    ir::Graph forward = lower(named<"out">(matmul(weights, v)));
    ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v", "slope"}, {"out"}});
    auto exe = be->compile(g);
    int fused = 0;
    for (const auto& n : exe->graph().nodes())
      if (n.op == ir::Op::flex_attention) {
        ++fused;
        std::printf("\nfused flex attention, modifier:\n  %s\n", ir::region_expression(*n.region).c_str());
      }
    if (be->name() != "reference" && fused != 1) return 1;

    // Packed documents of 128 tokens at N = 1024, training q, k and v (a trained slope's gradient
    // is score-sized before its sum): the report says what the kernels skipped.
    ir::Graph qkv_grads = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
    auto big = backend::random_inputs(qkv_grads, {{"N", 1024}}, 4);
    for (int i = 0; i < 1024; ++i) big.at("doc").data<std::int32_t>()[i] = i / 128;
    for (float& s : std::span(big.at("slope").data<float>(), 2)) s = 0.1f;
    if (be->name() != "reference") {
      auto long_exe = be->compile(qkv_grads);
      long_exe->run(big);
      if (long_exe->tile_counts().empty()) std::printf("(%s does not count the tiles it skips)\n", be->name().c_str());
      for (const auto& t : long_exe->tile_counts())
        std::printf("%-22s skipped %5.1f%% of %lld scores in blocks wholly masked\n",
                    std::string(ir::op_name(long_exe->graph().node(t.value).op)).c_str(), 100.0 * t.skipped_fraction(),
                    static_cast<long long>(t.computed + t.skipped));
      std::printf("planned memory %.1f MB (the scores alone would be %.1f MB per head)\n", static_cast<double>(long_exe->planned_bytes()) / 1e6,
                  1024.0 * 1024.0 * 4 / 1e6);
      if (long_exe->planned_bytes() >= 2 * 1024 * 1024 * 4) return 1;  // fused: nothing N x N per head
    }

    // The same numbers as the float64 reference, outputs and gradients, at N = 40.
    auto small = backend::random_inputs(g, {{"N", 40}}, 5);
    for (int i = 0; i < 40; ++i) small.at("doc").data<std::int32_t>()[i] = i / 7;
    auto report = backend::check_equivalence(g, small, {be->name()});
    std::printf("\n%s", report.table().c_str());
    return report.pass() ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
