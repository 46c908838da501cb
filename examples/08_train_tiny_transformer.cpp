// Training a tiny causal transformer with generated backward graphs, on the backend named on the
// command line: it learns to copy a sequence of symbols after a separator. Parameters and the
// optimizer's state (SGD with momentum) stay on the backend; each step uploads a batch and reads
// back the loss. With f16 or bf16, mixed precision: matmuls and attention in it, the parameters
// an f32 master copy (f16 scales its loss dynamically).
//   example_08_train_tiny_transformer [backend] [steps] [f32|f16|bf16]
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <qkv/backends.hpp>
#include <qkv/train.hpp>

#include "models/models.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  const std::string backend_name = argc > 1 ? argv[1] : backend::default_backend_name();
  const int steps = argc > 2 ? std::atoi(argv[2]) : 100;
  const std::optional<DType> dtype = parse_dtype(argc > 3 ? argv[3] : "f32");
  if (!dtype || (*dtype != DType::f32 && !is_half(*dtype))) {
    std::fprintf(stderr, "train_copy: the dtype is f32, f16 or bf16, not %s\n", argv[3]);
    return 2;
  }
  train::MixedPrecision mixed;
  mixed.compute = *dtype;
  std::unique_ptr<backend::Backend> be;
  try {
    be = backend::create(backend_name);
  } catch (const BackendError& e) {
    std::fprintf(stderr, "train_copy: backend %s cannot start, skipped: %s\n", backend_name.c_str(), e.what());
    return 77;
  }
  try {
    ir::Graph model = models::copy_task_model();
    auto params = models::copy_task_params();
    train::Trainer trainer(model, "loss", params, train::Sgd{.lr = 0.3, .momentum = 0.9}, *be,
                           train::initialize(model, params, {train::Init::xavier_uniform}, 7), {}, mixed);
    const double chance = models::copy_task_chance_loss();
    std::printf("training on %s (%s) in %s: %d steps, batch 32, chance loss %.4f\n", be->name().c_str(), be->device().c_str(),
                std::string(dtype_name(*dtype)).c_str(), steps, chance);
    double first = 0, last = 0;
    for (int s = 0; s < steps; ++s) {
      last = trainer.step(models::copy_task_batch(32, 1000 + static_cast<std::uint64_t>(s)));
      if (s == 0) {
        first = last;
        std::printf("memory held by one step (activations kept for the backward): %lld bytes\n", static_cast<long long>(trainer.planned_bytes()));
      }
      std::printf("step %4d  loss %.4f\n", s, last);
    }
    std::printf("loss %.4f -> %.4f (chance %.4f)\n", first, last, chance);
    if (last > 0.25 * chance) {
      std::fprintf(stderr, "train_copy: the loss did not fall below a quarter of chance\n");
      return 1;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "train_copy: %s\n", e.what());
    return 1;
  }
  return 0;
}
