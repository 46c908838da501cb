// The next-token loss a decoder is fine-tuned with, built on the model's forward graph.
#include "ir/error.hpp"
#include "ir/passes/passes.hpp"
#include "models/pretrained.hpp"

namespace qkv::models {

ir::Graph lm_loss_graph(const Pretrained& model) {
  using ir::Op;
  ir::Graph g = ir::rebuild(model.graph);
  if (model.data != std::vector<std::string>{"input_ids", "position_ids"} || g.outputs().empty() || g.outputs()[0].first != "logits")
    throw UsageError(model.dir + ": a " + model.model_type + " model has no next-token logits to train (decoders such as gpt2 and llama do)");
  const ir::ValueId logits = g.output("logits");
  const ir::Shape s = g.node(logits).shape;  // [B, T, V], V static
  const ir::ValueId targets = g.add_input("targets", DType::i32, {s[0], s[1]});
  ir::Attrs last, depth, all;
  last.axis = 2;
  depth.depth = s[2];
  all.axis = 0;
  all.keepdim = false;
  const ir::ValueId picked = g.add(Op::one_hot, {targets}, depth);  // ids outside [0, V) (-1) pick nothing
  ir::ValueId log_likelihood = g.add(Op::mul, {picked, g.add(Op::log_softmax, {logits}, last)});
  ir::ValueId scored = picked;
  for (int i = 0; i < 3; ++i) {
    log_likelihood = g.add(Op::reduce_sum, {log_likelihood}, all);
    scored = g.add(Op::reduce_sum, {scored}, all);
  }
  const ir::ValueId count = g.add(Op::max, {scored, g.constant(1.0)});
  g.clear_results();
  g.set_output("loss", g.add(Op::neg, {g.add(Op::div, {log_likelihood, count})}));
  return ir::rebuild(g);
}

}  // namespace qkv::models
