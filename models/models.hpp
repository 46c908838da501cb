// The built-in models the qkv tool runs, each written in the DSL (models/*.cpp).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.hpp"
#include "ir/tensor.hpp"

namespace qkv::models {

/// --set values of one model, read with the types its options declare; errors name the option.
class Options {
 public:
  Options() = default;
  explicit Options(std::map<std::string, std::string> values) : values_(std::move(values)) {}
  bool flag(const std::string& name) const;
  double number(const std::string& name) const;
  std::int64_t integer(const std::string& name) const;
  const std::string& text(const std::string& name) const;
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
};

struct OptionSpec {
  std::string name;
  std::string default_value;
  std::string help;
};

/// Sizes of named dims (B, N, ...).
using Dims = std::map<std::string, std::int64_t>;

/// A built-in model: a DSL function of its options. Inputs listed in `data` are data; the other
/// inputs are parameters, named as the PyTorch module the model mirrors names them.
struct ModelSpec {
  std::string name;
  std::string summary;
  std::vector<OptionSpec> options;
  std::vector<std::string> data;
  Dims dims;  // default sizes of the named dims, for random inputs
  /// The forward graph for options and the dims bound so far (sdpa's default scale reads D).
  std::function<ir::Graph(const Options&, const Dims&)> build;
};

/// Every built-in model, in the order `qkv models` lists them.
const std::vector<ModelSpec>& all_models();
/// The model called `name`; throws UsageError listing the models.
const ModelSpec& find_model(const std::string& name);
/// `set` checked against the model's options (unknown names and bad values throw
/// UsageError) and completed with defaults.
Options resolve_options(const ModelSpec& model, const std::map<std::string, std::string>& set);

/// Scaled dot-product attention over q [B, N, D], k [B, M, D], v [B, M, Dv]; outputs "out"
/// [B, N, Dv] and "weights" [B, N, M]. Options: causal, mask (a bool input [B, N, M], true keeps),
/// scale (default 1/sqrt(D), resolved when the graph is bound: one graph serves every D).
struct SdpaOptions {
  bool causal = false;
  bool mask = false;
  std::optional<double> scale;    // none: 1/sqrt(D), resolved when D is bound
  bool weights = true;            // also output the weights (which keeps the score matrix)
  std::optional<double> softcap;  // soft-cap the scores at this value (a score modifier)
  double dropout = 0.0;           // dropout on the weights with this probability, keyed by an i32 input "seed"
};
ir::Graph sdpa(const SdpaOptions& options);

/// The copy task: L random symbols, a separator, the same L symbols again; each position predicts
/// the next token, and only the copy can be predicted (other targets are -1, ignored).
struct CopyTask {
  static constexpr std::int64_t symbols = 8, separator = 8, vocab = 10, length = 5, seq = 2 * length + 1, dim = 32;
};

/// A tiny causal transformer for the copy task: token embeddings (one_hot @ embed) plus learned
/// positions, one causal attention layer with a residual connection, a linear head, and the
/// cross-entropy loss (output "loss"). Inputs: tokens and targets i32 [B, seq]; parameters
/// copy_task_params().
ir::Graph copy_task_model();
std::vector<std::string> copy_task_params();
/// A batch of copy-task sequences from a seed: "tokens" and "targets".
std::map<std::string, Tensor, std::less<>> copy_task_batch(std::int64_t batch, std::uint64_t seed);
/// The loss of guessing uniformly among the symbols at the scored positions.
double copy_task_chance_loss();

/// The sinusoidal position encoding [N, 64] (output "pe"), its length bound by input "x" [N, 64].
ir::Graph sinusoidal_positions_graph();

/// Names of the built-in models.
std::vector<std::string> model_names();

}  // namespace qkv::models
