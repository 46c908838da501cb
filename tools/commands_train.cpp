// qkv train: the copy task (a one-layer causal transformer learns to repeat its input), with a
// loss curve; data-parallel under mpirun.
#include <cstdio>
#include <optional>

#include "io/file.hpp"
#include "models/models.hpp"
#include "plot/figure.hpp"
#include "tools/commands.hpp"
#include "train/init.hpp"
#include "train/trainer.hpp"

namespace qkv::tool {

int cmd_train(const TrainFlags& f) {
  if (f.steps < 1 || f.batch < 1 || !(f.lr > 0)) throw UsageError("--steps and --batch must be positive, --lr above 0");
  const std::optional<DType> dtype = parse_dtype(f.dtype);
  if (!dtype || (*dtype != DType::f32 && !is_half(*dtype))) throw UsageError("--dtype " + f.dtype + ": f32, f16 or bf16");
  train::MixedPrecision mixed;
  mixed.compute = *dtype;
  // Under mpirun, data-parallel: each rank trains on its shard of every batch, on its own backend
  // (--backend a,b: rank i takes the i-th, cycling), and rank 0 reports.
  distributed::Communicator& comm = distributed::Communicator::world();
  const bool lead = comm.rank() == 0;
  if (f.batch % comm.size() != 0)
    throw UsageError("--batch " + std::to_string(f.batch) + " does not divide into " + std::to_string(comm.size()) + " equal shards, one per rank");
  if (lead && !f.plot.empty()) {  // before training, not after
    if (!plot::format_of(f.plot)) throw UsageError("--plot " + f.plot + ": name a .png, .svg or .pdf file");
    io::check_writable(f.plot);
  }
  const std::vector<std::string> choices = backend_list(f.backend);
  auto be = backend::create(choices[static_cast<std::size_t>(comm.rank()) % choices.size()]);
  ir::Graph model = models::copy_task_model();
  auto params = models::copy_task_params();
  train::Trainer trainer(model, "loss", params, train::Sgd{.lr = f.lr, .momentum = 0.9}, *be,
                         train::initialize(model, params, {train::Init::xavier_uniform}, f.seed), train::DataParallel{.comm = &comm}, mixed);
  const std::vector<std::string> names = comm.allgather(be->name());
  if (lead) {
    if (comm.size() == 1) std::printf("copy task on %s (%s)", be->name().c_str(), be->device().c_str());
    else std::printf("copy task, data-parallel over %d ranks (batch %d each):", comm.size(), f.batch / comm.size());
    for (std::size_t r = 0; comm.size() > 1 && r < names.size(); ++r) std::printf("%s rank %zu on %s", r ? "," : "", r, names[r].c_str());
    std::printf("; %d steps, batch %d, SGD lr %g momentum 0.9; chance loss %.4f\n", f.steps, f.batch, f.lr, models::copy_task_chance_loss());
    if (mixed.compute != DType::f32)
      std::printf("mixed precision: matmuls and attention in %s, f32 parameters%s\n", f.dtype.c_str(),
                  mixed.scales_loss() ? ", dynamic loss scaling" : "");
  }
  std::vector<double> losses;
  int skipped = 0;
  for (int s = 0; s < f.steps; ++s) {
    const auto batch = models::copy_task_batch(f.batch, f.seed * 1000 + static_cast<std::uint64_t>(s));
    losses.push_back(trainer.step(train::shard_batch(batch, comm.rank(), comm.size())));
    skipped += trainer.last_step_skipped();
    if (!lead) continue;
    const int width = 30, done = (s + 1) * width / f.steps;
    std::printf("step %4d/%d [%s%s] loss %.4f\n", s + 1, f.steps, std::string(static_cast<std::size_t>(done), '#').c_str(),
                std::string(static_cast<std::size_t>(width - done), '.').c_str(), losses.back());
  }
  if (!lead) return 0;
  std::printf("loss %.4f -> %.4f\n", losses.front(), losses.back());
  if (mixed.scales_loss()) std::printf("loss scale %g; %d of %d steps skipped (gradients overflowed f16)\n", trainer.loss_scale(), skipped, f.steps);
  if (!f.plot.empty()) {
    plot::LinePlot curve;
    curve.title = "copy task: cross-entropy loss per step", curve.x_name = "SGD step", curve.y_name = "loss";
    curve.ys = losses;
    curve.reference = models::copy_task_chance_loss(), curve.reference_label = "chance";
    io::write_file_atomic(f.plot, plot::render(plot::to_svg(curve), *plot::format_of(f.plot)));
    std::printf("loss curve -> %s\n", f.plot.c_str());
  }
  return 0;
}

}  // namespace qkv::tool
