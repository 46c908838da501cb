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

ir::Graph build_paged_attention(const Options& o, const Dims&) {
  constexpr DimArg H = "H", Hkv = "Hkv", G = H / Hkv, D = "D";
  auto q = input<"q">(dim<"B">, dim<H>, dim<"T">, dim<D>);
  auto k_pages = input<"k_pages">(dim<"pages">, dim<Hkv>, dim<"page">, dim<D>);
  auto v_pages = input<"v_pages">(dim<"pages">, dim<Hkv>, dim<"page">, dim<D>);
  auto table = input<"block_table", DType::i32>(dim<"B">, dim<"NP">);
  auto positions = input<"positions", DType::i32>(dim<"B">, dim<"T">);
  using Q = decltype(q);
  // Query heads h G .. h G + G - 1 share key/value head h: [B, Hkv, G, T, D] against [B, Hkv, 1, S, D].
  constexpr ir::Shape groups{Q::shape[0], Hkv.value, G.value, Q::shape[2], D.value};
  auto grouped = [](auto t) {
    using T = decltype(t);
    constexpr ir::Shape s{T::shape[0], T::shape[1], 1, T::shape[2], T::shape[3]};
    return dsl::detail::reshape_to<s>(t);
  };
  // A sequence's slots are its positions: query t of sequence b sees slots <= positions[b, t].
  constexpr ir::Shape per_query{Q::shape[0], 1, 1, Q::shape[2], 1};
  auto slot = dsl::detail::reshape_to<per_query>(cast(positions));
  auto visible = mask_mod([=](auto, auto, auto, auto kv_idx) { return slot - kv_idx >= 0.0; });
  auto out = scaled_dot_product_attention(dsl::detail::reshape_to<groups, DimList<G>>(q), grouped(page_gather(k_pages, table)),
                                          grouped(page_gather(v_pages, table)), visible);
  return ir::specialize_dims(lower(named<"out">(dsl::detail::reshape_to<Q::shape>(out))),
                             {{"H", o.integer("heads")}, {"Hkv", o.integer("kv_heads")}, {"pages", o.integer("pages")}});
}

}  // namespace qkv::models
