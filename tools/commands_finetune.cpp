// qkv train MODEL_DIR --text FILE: fine-tuning a decoder on the next tokens of a text with AdamW
// (weight decay, gradient clipping), data-parallel under mpirun, saved as a model folder.
#include <algorithm>
#include <cstdio>
#include <random>

#include "distributed/communicator.hpp"
#include "io/file.hpp"
#include "io/tokenizer.hpp"
#include "models/pretrained.hpp"
#include "tools/commands.hpp"
#include "train/trainer.hpp"

namespace qkv::tool {

int cmd_finetune(const FinetuneFlags& f) {
  if (f.text.empty()) throw UsageError("qkv train " + f.model + ": give --text FILE, the text to fine-tune on");
  if (f.steps < 1 || f.batch < 1 || f.seq < 2 || !(f.lr > 0) || f.weight_decay < 0 || f.max_grad_norm < 0)
    throw UsageError("--steps, --batch and --lr must be positive, --seq at least 2, --weight-decay and --max-grad-norm at least 0");
  if (!models::is_model_dir(f.model)) throw UsageError(f.model + ": not a model folder (a folder with config.json, as transformers saves one)");
  distributed::Communicator& comm = distributed::Communicator::world();
  const bool lead = comm.rank() == 0;
  if (f.batch % comm.size() != 0)
    throw UsageError("--batch " + std::to_string(f.batch) + " does not divide into " + std::to_string(comm.size()) + " equal shards, one per rank");
  if (lead && !f.save.empty()) io::check_writable_dir(f.save);  // before training, not after
  // Trained in f32: a half checkpoint's weights widened once (the master copy), saved in f32.
  models::LoadOptions options;
  options.weights = models::WeightDtype::f32;
  const models::Pretrained model = models::load_pretrained(f.model, options);
  const ir::Graph loss = models::lm_loss_graph(model);
  if (f.seq > model.max_positions)
    throw UsageError("--seq " + std::to_string(f.seq) + ": more than the model's " + std::to_string(model.max_positions) + " positions");
  const io::Tokenizer tokenizer = io::Tokenizer::from_folder(f.model);
  const std::vector<std::int32_t> tokens = tokenizer.encode(io::read_file(f.text), false);
  if (static_cast<std::int64_t>(tokens.size()) < f.seq + 1)
    throw UsageError(f.text + ": " + std::to_string(tokens.size()) + " tokens, fewer than --seq + 1 = " + std::to_string(f.seq + 1));
  const std::vector<std::string> choices = backend_list(f.backend);
  auto be = backend::create(choices[static_cast<std::size_t>(comm.rank()) % choices.size()]);
  // The parameters train; the model's buffers (Llama's rotary frequencies) are data, the same every step.
  std::vector<std::string> params;
  backend::TensorMap initial, buffers;
  for (const auto& [name, t] : model.weights) {
    const bool trained = std::any_of(model.parameters.begin(), model.parameters.end(), [&](const auto& p) { return p.first == name; });
    if (trained) params.push_back(name);
    (trained ? initial : buffers).emplace(name, t);
  }
  const train::AdamW adamw{.lr = f.lr, .weight_decay = f.weight_decay, .max_grad_norm = f.max_grad_norm};
  train::Trainer trainer(loss, "loss", params, adamw, *be, initial, train::DataParallel{.comm = &comm});
  if (lead) {
    std::printf("fine-tuning %s (%s, %zu parameter tensors) on %s: %zu tokens, %d steps of %d sequences of %d tokens", f.model.c_str(),
                model.model_type.c_str(), params.size(), f.text.c_str(), tokens.size(), f.steps, f.batch, f.seq);
    std::printf("; AdamW lr %g, weight decay %g, clip %g; %s\n", f.lr, f.weight_decay, f.max_grad_norm,
                comm.size() > 1 ? ("data-parallel over " + std::to_string(comm.size()) + " ranks").c_str() : be->name().c_str());
  }
  // Batches: windows of seq + 1 tokens at random offsets (the same on every rank); each rank its shard.
  std::mt19937_64 rng(f.seed);
  std::uniform_int_distribution<std::size_t> offset(0, tokens.size() - static_cast<std::size_t>(f.seq) - 1);
  std::vector<double> losses;
  for (int s = 0; s < f.steps; ++s) {
    Tensor ids(DType::i32, {f.batch, f.seq}), targets(DType::i32, {f.batch, f.seq}), positions(DType::i32, {f.batch, f.seq});
    for (int b = 0; b < f.batch; ++b) {
      const std::size_t at = offset(rng);
      for (int t = 0; t < f.seq; ++t) {
        ids.data<std::int32_t>()[b * f.seq + t] = tokens[at + static_cast<std::size_t>(t)];
        targets.data<std::int32_t>()[b * f.seq + t] = tokens[at + static_cast<std::size_t>(t) + 1];
        positions.data<std::int32_t>()[b * f.seq + t] = t;
      }
    }
    backend::TensorMap batch = train::shard_batch({{"input_ids", ids}, {"targets", targets}, {"position_ids", positions}}, comm.rank(), comm.size());
    for (const auto& [name, t] : buffers) batch.emplace(name, t);
    losses.push_back(trainer.step(batch));
    if (lead) std::printf("step %4d/%d loss %.4f\n", s + 1, f.steps, losses.back());
  }
  if (!lead) return 0;
  std::printf("loss %.4f -> %.4f\n", losses.front(), losses.back());
  if (!f.save.empty()) {
    models::save_pretrained(model, trainer.parameters(), f.save);
    std::printf("saved -> %s (model.safetensors, config and tokenizer)\n", f.save.c_str());
  }
  return 0;
}

}  // namespace qkv::tool
