// GPT-2 written with the DSL's layers and attention library; the blocks are one C++ loop over the
// config's layers, each reading its parameters by checkpoint name.
#include "models/gpt2.hpp"

#include "ir/error.hpp"
#include "models/step_graph.hpp"

namespace qkv::models {

namespace {

constexpr DimArg E = "E", H = "H", V = "V", P = "P", F = "F";

template <class M> auto bias_of(const M& m) { return param(m.bias.name, dim<E>); }

template <Expr X> auto norm(X x, const LayerNorm& ln, double eps) {
  return layer_norm(x, param(ln.weight.name, dim<E>), param(ln.bias.name, dim<E>), eps);
}

/// Block K of the packed projection [B, T, 3E]: q, k or v [B, T, E].
template <std::int64_t K, Expr X> auto third(X qkv) {
  constexpr ir::Shape packed{X::shape[0], X::shape[1], 3, E.value}, one{X::shape[0], X::shape[1], E.value};
  return dsl::detail::reshape_to<one>(slice<2, K, K + 1>(dsl::detail::reshape_to<packed>(qkv)));
}

using detail::NoCache;
using detail::Updates;

template <Expr X, class C> X block(X x, const Gpt2Block& b, double eps, const C& cache, std::size_t layer, Updates& updates, detail::Named* weights) {
  auto a = norm(x, b.ln_1, eps);
  auto qkv = matmul(a, param(b.attn.c_attn.weight.name, dim<E>, dim<3 * E>)) + param(b.attn.c_attn.bias.name, dim<3 * E>);
  auto q = split_heads<H>(third<0>(qkv));
  auto k = split_heads<H>(third<1>(qkv));
  auto v = split_heads<H>(third<2>(qkv));
  auto heads = [&] {
    if constexpr (std::is_same_v<C, NoCache>) {
      if (weights) weights->emplace_back("weights." + std::to_string(layer), attention_weights(q, k, causal).term());
      return scaled_dot_product_attention(q, k, v, causal);
    } else {
      auto [keys, values, visible] = detail::cached_keys_values<H, E / H, 4>(cache, layer, k, v, updates);
      return scaled_dot_product_attention(q, keys, values, visible);
    }
  }();
  auto attended = matmul(merge_heads<E.value>(heads), param(b.attn.c_proj.weight.name, dim<E>, dim<E>)) + bias_of(b.attn.c_proj);
  auto h = x + attended;
  auto m = norm(h, b.ln_2, eps);
  auto up = gelu_tanh(matmul(m, param(b.mlp.c_fc.weight.name, dim<E>, dim<F>)) + param(b.mlp.c_fc.bias.name, dim<F>));
  return h + (matmul(up, param(b.mlp.c_proj.weight.name, dim<F>, dim<E>)) + bias_of(b.mlp.c_proj));
}

}  // namespace

Gpt2LMHeadModel make_gpt2(const Gpt2Config& c) {
  if (c.activation_function.value_or("gelu_new") != "gelu_new")
    throw UsageError("gpt2: activation_function \"" + *c.activation_function + "\" is not built (gelu_new is)");
  if (!c.scale_attn_weights.value_or(true) || c.scale_attn_by_inverse_layer_idx.value_or(false) || c.reorder_and_upcast_attn.value_or(false))
    throw UsageError(
        "gpt2: only attention scaled by 1/sqrt(head dim) is built (scale_attn_weights, no scale_attn_by_inverse_layer_idx or "
        "reorder_and_upcast_attn)");
  if (c.n_head <= 0 || c.n_embd % c.n_head != 0)
    throw UsageError("gpt2: n_embd " + std::to_string(c.n_embd) + " is not divisible by n_head " + std::to_string(c.n_head));
  const std::int64_t e = c.n_embd, f = c.n_inner.value_or(4 * e);
  auto ln = [&] { return LayerNorm{{"", {e}}, {"", {e}}}; };
  Gpt2LMHeadModel m;
  m.transformer.wte.weight.shape = {c.vocab_size, e};
  m.transformer.wpe.weight.shape = {c.n_positions, e};
  for (std::int64_t i = 0; i < c.n_layer; ++i) {
    Gpt2Block b;
    b.ln_1 = ln();
    b.attn.c_attn = {{"", {e, 3 * e}}, {"", {3 * e}}};
    b.attn.c_proj = {{"", {e, e}}, {"", {e}}};
    b.ln_2 = ln();
    b.mlp.c_fc = {{"", {e, f}}, {"", {f}}};
    b.mlp.c_proj = {{"", {f, e}}, {"", {e}}};
    m.transformer.h.push_back(std::move(b));
  }
  m.transformer.ln_f = ln();
  if (!c.tie_word_embeddings.value_or(true)) m.lm_head = LmHead{{"", {c.vocab_size, e}}};
  name_parameters(m);
  return m;
}

namespace {

/// The model's graph from its inputs' expressions: the blocks with or without a cache.
template <class C, Expr Ids, Expr Positions>
ir::Graph build(const Gpt2LMHeadModel& m, const Gpt2Config& c, Ids ids, Positions positions, const C& cache, const GraphOutputs& outputs) {
  const double eps = c.layer_norm_epsilon.value_or(1e-5);
  auto wte = param(m.transformer.wte.weight.name, dim<V>, dim<E>);
  auto x = embedding(ids, wte) + embedding(positions, param(m.transformer.wpe.weight.name, dim<P>, dim<E>));
  Updates updates;
  detail::Named weights;
  for (std::size_t i = 0; i < m.transformer.h.size(); ++i)
    x = block(x, m.transformer.h[i], eps, cache, i, updates, outputs.attention_weights ? &weights : nullptr);
  auto h = norm(x, m.transformer.ln_f, eps);
  auto rows = detail::head_rows<C>(h);
  auto logits = [&] {
    if (m.lm_head) return matmul<false, true>(rows, param(m.lm_head->weight.name, dim<V>, dim<E>));
    return matmul<false, true>(rows, wte);  // tied: the token embedding is the head
  }();
  const std::map<std::string, std::int64_t> sizes{
      {"E", c.n_embd}, {"H", c.n_head}, {"V", c.vocab_size}, {"P", c.n_positions}, {"F", c.n_inner.value_or(4 * c.n_embd)}};
  return detail::lower_step(logits, outputs.hidden ? &h : nullptr, weights, updates, sizes);
}

}  // namespace

ir::Graph gpt2_graph(const Gpt2LMHeadModel& m, const Gpt2Config& c, const GraphOutputs& outputs) {
  return build(m, c, input<"input_ids", DType::i32>(dim<"B">, dim<"T">), input<"position_ids", DType::i32>(dim<"B">, dim<"T">), NoCache{}, outputs);
}

ir::Graph gpt2_paged_step_graph(const Gpt2LMHeadModel& m, const Gpt2Config& c) {
  const auto cache = detail::paged_cache_inputs();
  return build(m, c, input<"input_ids", DType::i32>(dim<"B">, dim<"T">), cache.positions, cache, GraphOutputs{});
}

ir::Graph gpt2_step_graph(const Gpt2LMHeadModel& m, const Gpt2Config& c) {
  const auto cache = detail::cache_inputs();
  return build(m, c, input<"input_ids", DType::i32>(dim<"B">, dim<"T">), cache.positions, cache, GraphOutputs{});
}

}  // namespace qkv::models
