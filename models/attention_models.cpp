// The multi-head models: nn.MultiheadAttention and the self-, causal self- and cross-attention
// modules over it (parameters named as torch names them), and Llama-style grouped-query
// attention, written with named sizes and built for those the options give.
#include "dsl/dsl.hpp"
#include "models/builders.hpp"

namespace qkv::models {

namespace {

/// Outputs of a multi-head result: out, weights (mean over heads), weights_per_head.
template <class R> ir::Graph lower_heads(const R& r) {
  return lower(named<"out">(r.output), named<"weights">(mean_over_heads(r.weights)), named<"weights_per_head">(r.weights));
}

enum class Kind { mha, self, causal_self, cross };

template <Kind K> ir::Graph build_multi_head(const Options& o) {
  constexpr DimArg E = "E", H = "H";
  auto params = mha_params<"", E>();
  auto x = input<"x">(dim<"B">, dim<"N">, dim<E>);
  auto build = [&] {
    if constexpr (K == Kind::mha) {
      auto query = input<"query">(dim<"B">, dim<"N">, dim<E>);
      auto key = input<"key">(dim<"B">, dim<"M">, dim<E>);
      auto value = input<"value">(dim<"B">, dim<"M">, dim<E>);
      if (o.flag("causal")) return lower_heads(multi_head_attention<H>(query, key, value, params, causal_bottom_right));
      return lower_heads(multi_head_attention<H>(query, key, value, params));
    } else if constexpr (K == Kind::self) {
      return lower_heads(self_attention<H>(x, params));
    } else if constexpr (K == Kind::causal_self) {
      return lower_heads(causal_self_attention<H>(x, params));
    } else {
      return lower_heads(cross_attention<H>(x, input<"memory">(dim<"B">, dim<"M">, dim<E>), params));
    }
  };
  return with_sizes(build(), o);
}

}  // namespace

ir::Graph build_mha(const Options& o, const Dims&) { return build_multi_head<Kind::mha>(o); }
ir::Graph build_self_attention(const Options& o, const Dims&) { return build_multi_head<Kind::self>(o); }
ir::Graph build_causal_self_attention(const Options& o, const Dims&) { return build_multi_head<Kind::causal_self>(o); }
ir::Graph build_cross_attention(const Options& o, const Dims&) { return build_multi_head<Kind::cross>(o); }

ir::Graph build_gqa(const Options& o, const Dims&) {
  constexpr DimArg E = "E", H = "H", Hkv = "Hkv", kv = Hkv * (E / H);
  auto x = input<"x">(dim<"B">, dim<"N">, dim<E>);
  auto q = linear(x, input<"q_proj.weight">(dim<E>, dim<E>));
  auto k = linear(x, input<"k_proj.weight">(dim<kv>, dim<E>));
  auto v = linear(x, input<"v_proj.weight">(dim<kv>, dim<E>));
  auto wo = input<"o_proj.weight">(dim<E>, dim<E>);
  if (!o.flag("rope")) return with_sizes(lower(named<"out">(linear(grouped_query_attention<H, Hkv>(q, k, v, causal), wo))), o);
  // Rotary embeddings per head (half-split, as Llama in HF's layout), then the heads re-joined.
  auto rq = merge_heads<E.value>(rotary(split_heads<H>(q)));
  auto rk = merge_heads<kv.value>(rotary(split_heads<Hkv>(k)));
  return with_sizes(lower(named<"out">(linear(grouped_query_attention<H, Hkv>(rq, rk, v, causal), wo))), o);
}

}  // namespace qkv::models
