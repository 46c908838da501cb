// BERT written with the DSL: post-norm layers, the padding mask as flex attention's mask modifier
// (padding keys skipped, no [B, T, T] mask built), mean pooling over the kept tokens.
#include "models/bert.hpp"

#include "ir/error.hpp"
#include "models/step_graph.hpp"

namespace qkv::models {

namespace {

constexpr DimArg E = "E", H = "H", F = "F", V = "V", P = "P", Types = "Types";

template <DimArg Out, DimArg In, Expr X> auto dense(X x, const Linear& l) {
  return linear(x, param(l.weight.name, dim<Out>, dim<In>)) + param(l.bias->name, dim<Out>);
}

template <Expr X> auto norm(X x, const LayerNorm& n, double eps) {
  return layer_norm(x, param(n.weight.name, dim<E>), param(n.bias.name, dim<E>), eps);
}

template <Expr X, class Keep> X layer(X x, const BertLayer& l, double eps, const Keep& keep, std::size_t index, detail::Named* weights) {
  const BertSelfAttention& s = l.attention.self;
  auto q = split_heads<H>(dense<E, E>(x, s.query));
  auto k = split_heads<H>(dense<E, E>(x, s.key));
  auto v = split_heads<H>(dense<E, E>(x, s.value));
  if (weights) weights->emplace_back("weights." + std::to_string(index), attention_weights(q, k, keep).term());
  auto attended = merge_heads<E.value>(scaled_dot_product_attention(q, k, v, keep));
  auto h = norm(x + dense<E, E>(attended, l.attention.output.dense), l.attention.output.LayerNorm, eps);
  auto up = gelu(dense<F, E>(h, l.intermediate.dense));
  return norm(h + dense<E, F>(up, l.output.dense), l.output.LayerNorm, eps);
}

}  // namespace

BertModel make_bert(const BertConfig& c, bool pooler) {
  if (c.hidden_act.value_or("gelu") != "gelu") throw UsageError("bert: hidden_act \"" + *c.hidden_act + "\" is not built (gelu is)");
  if (c.position_embedding_type.value_or("absolute") != "absolute")
    throw UsageError("bert: position_embedding_type \"" + *c.position_embedding_type + "\" is not built (absolute is)");
  if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0)
    throw UsageError("bert: hidden_size " + std::to_string(c.hidden_size) + " is not divisible by num_attention_heads " +
                     std::to_string(c.num_attention_heads));
  const std::int64_t e = c.hidden_size, f = c.intermediate_size;
  auto linear = [](std::int64_t out, std::int64_t in) { return Linear{{"", {out, in}}, Parameter{"", {out}}}; };
  auto ln = [&] { return LayerNorm{{"", {e}}, {"", {e}}}; };
  BertModel m;
  m.embeddings = {{{"", {c.vocab_size, e}}}, {{"", {c.max_position_embeddings, e}}}, {{"", {c.type_vocab_size.value_or(2), e}}}, ln()};
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    BertLayer l;
    l.attention.self = {linear(e, e), linear(e, e), linear(e, e)};
    l.attention.output = {linear(e, e), ln()};
    l.intermediate.dense = linear(f, e);
    l.output = {linear(e, f), ln()};
    m.encoder.layer.push_back(std::move(l));
  }
  if (pooler) m.pooler = BertPooler{linear(e, e)};
  name_parameters(m);
  return m;
}

ir::Graph bert_graph(const BertModel& m, const BertConfig& c, const GraphOutputs& outputs) {
  const double eps = c.layer_norm_eps.value_or(1e-12);
  auto ids = input<"input_ids", DType::i32>(dim<"B">, dim<"T">);
  auto types = input<"token_type_ids", DType::i32>(dim<"B">, dim<"T">);
  auto positions = input<"position_ids", DType::i32>(dim<"B">, dim<"T">);
  auto mask = input<"attention_mask", DType::i32>(dim<"B">, dim<"T">);
  const BertEmbeddings& em = m.embeddings;
  auto x = norm(embedding(ids, param(em.word_embeddings.weight.name, dim<V>, dim<E>)) +
                    embedding(positions, param(em.position_embeddings.weight.name, dim<P>, dim<E>)) +
                    embedding(types, param(em.token_type_embeddings.weight.name, dim<Types>, dim<E>)),
                em.LayerNorm, eps);
  // Padding keys are skipped: key kv_idx of batch entry b is kept where attention_mask[b, kv_idx] is 1.
  auto keep = mask_mod([=](auto b, auto, auto, auto kv_idx) { return at(mask, b, kv_idx) > 0.5; });
  detail::Named weights;
  for (std::size_t i = 0; i < m.encoder.layer.size(); ++i)
    x = layer(x, m.encoder.layer[i], eps, keep, i, outputs.attention_weights ? &weights : nullptr);
  // Mean pooling over the kept tokens, then L2 normalisation (F.normalize's eps 1e-12).
  constexpr ir::Shape column{decltype(x)::shape[0], decltype(x)::shape[1], 1};
  auto kept = dsl::detail::reshape_to<column>(cast(mask));
  auto mean = sum<1, false>(x * kept) / maximum(sum<1, false>(kept), 1e-9);
  auto sentence = mean / maximum(sqrt(sum<-1>(mean * mean)), 1e-12);
  dsl::detail::Lowerer l;
  l.graph().set_output("last_hidden_state", l.emit(x.term()));
  if (m.pooler) {
    constexpr ir::Shape first{decltype(x)::shape[0], E.value};
    auto cls = dsl::detail::reshape_to<first>(slice<1, 0, 1>(x));
    l.graph().set_output("pooler_output", l.emit(tanh(dense<E, E>(cls, m.pooler->dense)).term()));
  }
  l.graph().set_output("sentence_embedding", l.emit(sentence.term()));
  for (const auto& [name, term] : weights) l.graph().set_output(name, l.emit(term));
  return ir::specialize_dims(l.graph(), {{"E", c.hidden_size},
                                         {"H", c.num_attention_heads},
                                         {"F", c.intermediate_size},
                                         {"V", c.vocab_size},
                                         {"P", c.max_position_embeddings},
                                         {"Types", c.type_vocab_size.value_or(2)}});
}

}  // namespace qkv::models
