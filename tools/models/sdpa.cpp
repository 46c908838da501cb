// The sdpa model: the DSL's scaled_dot_product_attention with named dims.
#include "dsl/dsl.hpp"
#include "tools/models/models.hpp"

namespace qkv::models {

namespace {
template <class... Opts>
ir::Graph build(double s, Opts... opts) {
  auto q = input<"q">(dim<"B">, dim<"N">, dim<"D">);
  auto k = input<"k">(dim<"B">, dim<"M">, dim<"D">);
  auto v = input<"v">(dim<"B">, dim<"M">, dim<"Dv">);
  auto w = attention_weights(q, k, scale(s), opts...);
  return lower(named<"out">(matmul(w, v)), named<"weights">(w));
}
}  // namespace

ir::Graph sdpa(const SdpaOptions& o) {
  auto mask = input<"mask", DType::boolean>(dim<"B">, dim<"N">, dim<"M">);
  if (o.causal && o.mask) return build(o.scale, mask, causal);
  if (o.causal) return build(o.scale, causal);
  if (o.mask) return build(o.scale, mask);
  return build(o.scale);
}

std::vector<std::string> model_names() { return {"sdpa"}; }

}  // namespace qkv::models
