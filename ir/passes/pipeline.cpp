// The pass pipeline a backend's compile runs, listed in order.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/verifier.hpp"

namespace qkv::ir {

namespace {
void after(const char* pass, const Graph& g) {
  verify(g);
  const char* env = std::getenv("QKV_PRINT_IR");
  if (env && std::string(env) == "after-all") std::fprintf(stderr, "// IR after %s\n%s", pass, print(g).c_str());
}
}  // namespace

Graph lower_for_backend(const Graph& g, const std::function<bool(const Node&)>& keep_composite, HalfInputs half_inputs) {
  after("input", g);
  Graph r = fuse_attention(g, keep_composite);  // only what the backend keeps fused
  after("fuse-attention", r);
  r = emulate_half_precision(r, half_inputs);  // before decomposing: a composite rounds its result once
  after("emulate-half-precision", r);
  r = group_query_heads(r, keep_composite);  // k and v shared by query heads: read once for them
  after("group-query-heads", r);
  r = decompose_composites(r, keep_composite);
  after("decompose-composites", r);
  r = eliminate_common_subexpressions(r);
  after("cse", r);
  r = fold_padded_sums(r);
  after("fold-padded-sums", r);
  r = eliminate_dead_code(r);
  after("dce", r);
  r = place_attention_lse(r);
  after("place-attention-lse", r);
  return r;
}

}  // namespace qkv::ir
