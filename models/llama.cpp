// Llama written with the DSL: per layer RMSNorm, q/k/v projections, rotary embeddings at the
// tokens' positions, grouped-query attention (the key/value heads broadcast over their query
// groups, nothing copied), the output projection and SwiGLU.
#include "models/llama.hpp"

#include <cmath>

#include "ir/error.hpp"
#include "models/step_graph.hpp"

namespace qkv::models {

namespace {

using detail::NoCache;
using detail::Updates;

// Hidden size, query heads, key/value heads, head dim, MLP width, vocabulary, query groups.
constexpr DimArg E = "E", H = "H", KV = "Hkv", D = "D", F = "F", V = "V";
constexpr DimArg G = DimArg::derived(ir::DimOp::quotient, H.value, KV.value);
constexpr DimArg Half = DimArg::derived(ir::DimOp::quotient, D.value, 2);

template <DimArg Out, DimArg In, Expr X> auto project(X x, const Linear& l) {
  auto y = linear(x, param(l.weight.name, dim<Out>, dim<In>));
  if (l.bias) return y + param(l.bias->name, dim<Out>);
  return y;  // the same type: an op's result is typed by its shape and dtype only
}

template <Expr X> auto norm(X x, const RmsNorm& n, double eps) { return rms_norm(x, param(n.weight.name, dim<E>), eps); }

/// [B, T, N * D] -> [B, N, T, D].
template <DimArg N, Expr X> auto heads(X x) {
  constexpr ir::Shape s{X::shape[0], X::shape[1], N.value, D.value};
  return permute<0, 2, 1, 3>(dsl::detail::reshape_to<s, DimList<N, D>>(x));
}

/// x [B, N, T, D] rotated as transformers' apply_rotary_pos_emb (the halves of the head dim):
/// (x1 cos - x2 sin, x2 cos + x1 sin) at angle position * inv_freq.
template <Expr X, Expr P, Expr F> auto rotate(X x, P positions, F inv_freq) {
  constexpr ir::Shape pairs{X::shape[0], X::shape[1], X::shape[2], 2, Half.value};
  constexpr ir::Shape column{P::shape[0], 1, P::shape[1], 1, 1};
  auto xp = dsl::detail::reshape_to<pairs, DimList<Half>>(x);
  auto x1 = slice<3, 0, 1>(xp);
  auto x2 = slice<3, 1, 2>(xp);
  auto angle = dsl::detail::reshape_to<column>(cast(positions)) * inv_freq;  // [B, 1, T, 1, D/2]
  auto c = cos(angle);
  auto s = sin(angle);
  return dsl::detail::reshape_to<X::shape>(concat<3>(x1 * c - x2 * s, x2 * c + x1 * s));
}

template <Expr X, Expr P, Expr Inv, class C>
X layer(X x, const LlamaDecoderLayer& l, double eps, P positions, Inv inv_freq, const C& cache, std::size_t index, Updates& updates,
        detail::Named* weights) {
  auto a = norm(x, l.input_layernorm, eps);
  auto q = rotate(heads<H>(project<H * D, E>(a, l.self_attn.q_proj)), positions, inv_freq);  // [B, H, T, D]
  auto k = rotate(heads<KV>(project<KV * D, E>(a, l.self_attn.k_proj)), positions, inv_freq);
  auto v = heads<KV>(project<KV * D, E>(a, l.self_attn.v_proj));
  // Query heads h G .. h G + G - 1 share key/value head h (repeat_kv), broadcast in the matmuls.
  constexpr ir::Shape q5{X::shape[0], KV.value, G.value, X::shape[1], D.value};
  auto q_groups = dsl::detail::reshape_to<q5, DimList<G>>(q);
  auto grouped = [](auto t) {
    using T = decltype(t);
    constexpr ir::Shape s{T::shape[0], T::shape[1], 1, T::shape[2], T::shape[3]};
    return dsl::detail::reshape_to<s>(t);
  };
  auto attended = [&] {
    if constexpr (std::is_same_v<C, NoCache>) {
      if (weights) {  // [B, Hkv, G, T, T] as [B, H, T, T]: query head h G + g is group g of key/value head h
        auto w = attention_weights(q_groups, grouped(k), causal);
        constexpr ir::Shape square{X::shape[0], H.value, X::shape[1], X::shape[1]};
        weights->emplace_back("weights." + std::to_string(index), dsl::detail::reshape_to<square>(w).term());
      }
      return scaled_dot_product_attention(q_groups, grouped(k), grouped(v), causal);
    } else {
      auto [keys, values, visible] = detail::cached_keys_values<KV, D, 5>(cache, index, k, v, updates);
      return scaled_dot_product_attention(q_groups, grouped(keys), grouped(values), visible);
    }
  }();  // [B, Hkv, G, T, D]
  constexpr ir::Shape per_head{X::shape[0], H.value, X::shape[1], D.value};
  constexpr ir::Shape merged{X::shape[0], X::shape[1], (H * D).value};
  auto joined = dsl::detail::reshape_to<merged>(permute<0, 2, 1, 3>(dsl::detail::reshape_to<per_head>(attended)));
  auto h = x + project<E, H * D>(joined, l.self_attn.o_proj);
  auto m = norm(h, l.post_attention_layernorm, eps);
  auto gated = silu(project<F, E>(m, l.mlp.gate_proj)) * project<F, E>(m, l.mlp.up_proj);
  return h + project<E, F>(gated, l.mlp.down_proj);
}

std::int64_t kv_heads(const LlamaConfig& c) { return c.num_key_value_heads.value_or(c.num_attention_heads); }
std::int64_t head_dim(const LlamaConfig& c) { return c.head_dim.value_or(c.hidden_size / c.num_attention_heads); }

/// rope_parameters (transformers 5) or rope_theta and rope_scaling (earlier).
RopeConfig rope_of(const LlamaConfig& c) {
  RopeConfig r = c.rope_parameters.value_or(c.rope_scaling.value_or(RopeConfig{}));
  if (!r.rope_theta) r.rope_theta = c.rope_theta.value_or(10000.0);
  if (!r.rope_type) r.rope_type = r.type.value_or("default");
  return r;
}

template <class C, Expr Ids, Expr Positions>
ir::Graph build(const LlamaForCausalLM& m, const LlamaConfig& c, Ids ids, Positions positions, const C& cache, const GraphOutputs& outputs) {
  const double eps = c.rms_norm_eps.value_or(1e-6);
  auto embed = param(m.model.embed_tokens.weight.name, dim<V>, dim<E>);
  auto inv_freq = param(kInvFreq, dim<Half>);
  auto x = embedding(ids, embed);  // an op's result, of the type each layer returns
  Updates updates;
  detail::Named weights;
  for (std::size_t i = 0; i < m.model.layers.size(); ++i)
    x = layer(x, m.model.layers[i], eps, positions, inv_freq, cache, i, updates, outputs.attention_weights ? &weights : nullptr);
  auto h = norm(x, m.model.norm, eps);
  auto rows = detail::head_rows<C>(h);
  auto logits = [&] {
    if (m.lm_head) return matmul<false, true>(rows, param(m.lm_head->weight.name, dim<V>, dim<E>));
    return matmul<false, true>(rows, embed);
  }();
  const std::map<std::string, std::int64_t> sizes{{"E", c.hidden_size}, {"H", c.num_attention_heads}, {"Hkv", kv_heads(c)},
                                                  {"D", head_dim(c)},   {"F", c.intermediate_size},   {"V", c.vocab_size}};
  return detail::lower_step(logits, outputs.hidden ? &h : nullptr, weights, updates, sizes);
}

}  // namespace

LlamaForCausalLM make_llama(const LlamaConfig& c) {
  if (c.hidden_act.value_or("silu") != "silu") throw UsageError("llama: hidden_act \"" + *c.hidden_act + "\" is not built (silu is)");
  const RopeConfig rope = rope_of(c);
  if (*rope.rope_type != "default" && *rope.rope_type != "llama3")
    throw UsageError("llama: rope_type \"" + *rope.rope_type + "\" is not built (default and llama3 are)");
  if (c.num_attention_heads <= 0 || kv_heads(c) <= 0 || c.num_attention_heads % kv_heads(c) != 0)
    throw UsageError("llama: num_key_value_heads " + std::to_string(kv_heads(c)) + " does not divide num_attention_heads " +
                     std::to_string(c.num_attention_heads));
  if (head_dim(c) <= 0 || head_dim(c) % 2 != 0) throw UsageError("llama: head_dim " + std::to_string(head_dim(c)) + " is not even");
  const std::int64_t e = c.hidden_size, d = head_dim(c), q = c.num_attention_heads * d, kv = kv_heads(c) * d, f = c.intermediate_size;
  const bool attention_bias = c.attention_bias.value_or(false), mlp_bias = c.mlp_bias.value_or(false);
  auto linear = [](std::int64_t out, std::int64_t in, bool bias) {
    Linear l{{"", {out, in}}, std::nullopt};
    if (bias) l.bias = Parameter{"", {out}};
    return l;
  };
  LlamaForCausalLM m;
  m.model.embed_tokens.weight.shape = {c.vocab_size, e};
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LlamaDecoderLayer l;
    l.input_layernorm.weight.shape = {e};
    l.self_attn = {linear(q, e, attention_bias), linear(kv, e, attention_bias), linear(kv, e, attention_bias), linear(e, q, attention_bias)};
    l.post_attention_layernorm.weight.shape = {e};
    l.mlp = {linear(f, e, mlp_bias), linear(f, e, mlp_bias), linear(e, f, mlp_bias)};
    m.model.layers.push_back(std::move(l));
  }
  m.model.norm.weight.shape = {e};
  if (!c.tie_word_embeddings.value_or(false)) m.lm_head = LmHead{{"", {c.vocab_size, e}}};
  name_parameters(m);
  return m;
}

Tensor llama_inv_freq(const LlamaConfig& c) {
  const RopeConfig rope = rope_of(c);
  const std::int64_t d = head_dim(c);
  Tensor t(DType::f32, {d / 2});
  float* inv = t.data<float>();
  // As transformers: float32 throughout.
  const auto theta = static_cast<float>(*rope.rope_theta);
  for (std::int64_t i = 0; i < d / 2; ++i) inv[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(d));
  if (*rope.rope_type == "llama3") {
    const auto factor = static_cast<float>(rope.factor.value_or(8.0)), low = static_cast<float>(rope.low_freq_factor.value_or(1.0)),
               high = static_cast<float>(rope.high_freq_factor.value_or(4.0));
    const auto old_context = static_cast<float>(rope.original_max_position_embeddings.value_or(8192));
    const float low_wavelen = old_context / low, high_wavelen = old_context / high;
    constexpr float two_pi = 6.283185307179586f;
    for (std::int64_t i = 0; i < d / 2; ++i) {
      const float wavelen = two_pi / inv[i];
      if (wavelen > low_wavelen) {
        inv[i] = inv[i] / factor;  // long wavelengths: interpolated
      } else if (!(wavelen < high_wavelen)) {
        const float smooth = (old_context / wavelen - low) / (high - low);
        inv[i] = (1 - smooth) * inv[i] / factor + smooth * inv[i];
      }
    }
  }
  return t;
}

ir::Graph llama_graph(const LlamaForCausalLM& m, const LlamaConfig& c, const GraphOutputs& outputs) {
  return build(m, c, input<"input_ids", DType::i32>(dim<"B">, dim<"T">), input<"position_ids", DType::i32>(dim<"B">, dim<"T">), NoCache{}, outputs);
}

ir::Graph llama_paged_step_graph(const LlamaForCausalLM& m, const LlamaConfig& c) {
  const auto cache = detail::paged_cache_inputs();
  return build(m, c, input<"input_ids", DType::i32>(dim<"B">, dim<"T">), cache.positions, cache, GraphOutputs{});
}

ir::Graph llama_step_graph(const LlamaForCausalLM& m, const LlamaConfig& c) {
  const auto cache = detail::cache_inputs();
  return build(m, c, input<"input_ids", DType::i32>(dim<"B">, dim<"T">), cache.positions, cache, GraphOutputs{});
}

}  // namespace qkv::models
