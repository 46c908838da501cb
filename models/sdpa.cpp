// The sdpa model: the DSL's scaled_dot_product_attention with named dims.
#include <cmath>

#include "dsl/dsl.hpp"
#include "models/builders.hpp"

namespace qkv::models {

namespace {
template <class... Opts> ir::Graph build_with(bool weights, Opts... opts) {
  auto q = input<"q">(dim<"B">, dim<"N">, dim<"D">);
  auto k = input<"k">(dim<"B">, dim<"M">, dim<"D">);
  auto v = input<"v">(dim<"B">, dim<"M">, dim<"Dv">);
  auto w = attention_weights(q, k, opts...);
  // Without the weights as an output nothing else reads the scores, and backends fuse.
  if (!weights) return lower(named<"out">(matmul(w, v)));
  return lower(named<"out">(matmul(w, v)), named<"weights">(w));
}

template <class... Opts> ir::Graph build_scaled(std::optional<double> s, bool weights, Opts... opts) {
  return s ? build_with(weights, scale(*s), opts...) : build_with(weights, opts...);
}

template <class... Opts> ir::Graph build_dropped(const SdpaOptions& o, Opts... opts) {
  if (o.dropout != 0.0) return build_scaled(o.scale, o.weights, attn_dropout(o.dropout, input<"seed", DType::i32>()), opts...);
  return build_scaled(o.scale, o.weights, opts...);
}

template <class... Opts> ir::Graph build(const SdpaOptions& o, Opts... opts) {
  return o.softcap ? build_dropped(o, softcap_scores(*o.softcap), opts...) : build_dropped(o, opts...);
}
}  // namespace

ir::Graph sdpa(const SdpaOptions& o) {
  auto mask = input<"mask", DType::boolean>(dim<"B">, dim<"N">, dim<"M">);
  if (o.causal && o.mask) return build(o, mask, causal);
  if (o.causal) return build(o, causal);
  if (o.mask) return build(o, mask);
  return build(o);
}

ir::Graph build_sdpa(const Options& o, const Dims&) {
  std::optional<double> scale, softcap;
  if (o.text("scale") != "auto") scale = o.number("scale");
  if (o.text("softcap") != "none") softcap = o.number("softcap");
  return sdpa({o.flag("causal"), o.flag("mask"), scale, o.flag("weights"), softcap, o.number("dropout")});
}

ir::Graph sinusoidal_positions_graph() { return lower(named<"pe">(sinusoidal_positions(input<"x">(dim<"N">, dim<64>)))); }

}  // namespace qkv::models
