// The qkv program: list, run, check, inspect, benchmark, draw and train attention models on any
// backend. Exit status: 0 success, 1 a failure (a check outside its budget, a backend error),
// 2 bad usage or input.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <deque>

#include "backends/backend.hpp"
#include "tools/commands.hpp"
#include "tools/models/models.hpp"

namespace {

using qkv::tool::Request;

/// NAME=VALUE options as given, turned into Request maps after parsing.
struct RawPairs {
  std::vector<std::string> set, in, dims;
};
std::deque<std::pair<Request*, RawPairs>> g_requests;  // a deque: the options keep references into it

/// The options every model command shares.
void add_model_options(CLI::App* app, Request& r) {
  RawPairs* raw = &g_requests.emplace_back(&r, RawPairs{}).second;
  app->add_option("model", r.target, "a built-in model (qkv models) or a graph's IR text FILE.qkv (qkv dump --ir writes one)")
      ->required();
  app->add_option("--set", raw->set, "a model option: NAME=VALUE (qkv models lists them)");
  app->add_option("--in", raw->in, "an input: NAME=FILE.npy (random from --seed when not given)");
  app->add_option("--weights", r.weights, "parameters: a .safetensors file or a folder of NAME.npy, under PyTorch's names");
  app->add_option("--dim", raw->dims, "the size of a named dim no input gives: NAME=SIZE");
  app->add_option("--seed", r.seed, "seed of the random inputs and parameters")->capture_default_str();
  app->add_flag("--grad", r.grad, "the backward graph: inputs d<output> (random unless given), outputs d_<input>");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qkv: attention models written in C++, lowered to an IR, run on reference, cpu and vulkan backends"};
  app.set_version_flag("--version", std::string("qkv ") + QKV_VERSION);
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every command");

  app.add_subcommand("devices", "list backends, their devices, and why one is unavailable");
  app.add_subcommand("ops", "the op x backend support table, generated from the op registry");
  app.add_subcommand("models", "the built-in models with their inputs, weights, outputs and options");

  std::string backend = qkv::backend::default_backend_name();
  const std::string backend_help = "reference, cpu or vulkan (default: $QKV_BACKEND or cpu)";

  Request run_r;
  std::vector<std::string> outs;
  auto* run = app.add_subcommand("run", "run a model on .npy inputs and write .npy outputs");
  add_model_options(run, run_r);
  run->add_option("--backend", backend, backend_help);
  run->add_option("--out", outs, "an output to write: NAME=FILE.npy");

  Request check_r;
  std::string backends = "reference,cpu,vulkan", dump_dir;
  auto* check = app.add_subcommand("check", "run a model (or all) on each backend and compare with the float64 reference");
  add_model_options(check, check_r);
  check->add_option("--backends", backends, "comma-separated backends, or all")->capture_default_str();
  double budget_factor = 8.0;
  check->add_option("--budget-factor", budget_factor, "budget = this x a plain float32 run's error, plus a few ulps")->capture_default_str();
  check->add_option("--dump-dir", dump_dir, "on failure, write the first failing node's inputs and a command reproducing it here");

  Request dump_r;
  bool ir = false, dot = false, glsl = false;
  std::string dump_backend;
  auto* dump = app.add_subcommand("dump", "print a model's IR, Graphviz drawing, generated shaders or backward graph");
  add_model_options(dump, dump_r);
  dump->add_flag("--ir", ir, "the IR text (default); qkv run FILE.qkv runs it");
  dump->add_flag("--dot", dot, "a Graphviz DOT drawing");
  dump->add_flag("--glsl", glsl, "the GLSL compute shaders the backend generates");
  dump->add_flag("--backward", dump_r.grad, "the backward graph (as --grad)");
  dump->add_option("--backend", dump_backend, "backend whose lowering --glsl shows (default vulkan)");

  Request explain_r;
  auto* explain = app.add_subcommand("explain", "per node: the kernel chosen, FLOPs, bytes; totals; whether the score matrix is materialised");
  add_model_options(explain, explain_r);
  explain->add_option("--backend", backend, backend_help);

  Request bench_r;
  std::string bench_backends = backend;
  int repeat = 20;
  auto* bench = app.add_subcommand("bench", "median time and GFLOP/s over repeated runs");
  add_model_options(bench, bench_r);
  bench->add_option("--backend", bench_backends, "a backend, a comma-separated list, or all");
  bench->add_option("--repeat", repeat, "timed runs")->capture_default_str();

  Request viz_r;
  std::string png_dir, labels;
  auto* viz = app.add_subcommand("viz", "attention-weight heatmaps (per head, mean, causal vs full) and the positional encoding, as PNG");
  add_model_options(viz, viz_r);
  viz->add_option("--backend", backend, backend_help);
  viz->add_option("--png", png_dir, "folder to write the PNG files to")->required();
  viz->add_option("--labels", labels, "token labels, comma-separated (queries down, keys across)");

  qkv::tool::TrainFlags train_f;
  train_f.backend = backend;
  auto* train = app.add_subcommand("train", "train a one-layer causal transformer on the copy task, with generated backward graphs");
  train->add_option("--backend", train_f.backend, backend_help);
  train->add_option("--steps", train_f.steps, "SGD steps")->capture_default_str();
  train->add_option("--batch", train_f.batch, "sequences per step")->capture_default_str();
  train->add_option("--lr", train_f.lr, "learning rate")->capture_default_str();
  train->add_option("--seed", train_f.seed, "seed of the parameters and batches")->capture_default_str();
  train->add_option("--png", train_f.png, "write the loss curve to this PNG file");

  if (argc > 1 && argv[1][0] != '-') {  // an unknown command, named in the error
    bool known = false;
    for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) known |= sub->get_name() == argv[1];
    if (!known) {
      std::string list;
      for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) list += (list.empty() ? "" : ", ") + sub->get_name();
      std::fprintf(stderr, "qkv: no command '%s' (commands: %s)\n", argv[1], list.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "qkv: %s (see --help)\n", e.what());
    return 2;
  }
  using namespace qkv::tool;
  try {
    for (auto& [request, raw] : g_requests) {
      request->set = pairs(raw.set, "--set");
      request->in = pairs(raw.in, "--in");
      request->dims = pairs(raw.dims, "--dim");
    }
    if (app.got_subcommand("devices")) return cmd_devices();
    if (app.got_subcommand("ops")) return cmd_ops();
    if (app.got_subcommand("models")) return cmd_models();
    if (run->parsed()) return cmd_run(run_r, backend, outs);
    if (check->parsed()) return cmd_check(check_r, backends, dump_dir, budget_factor);
    if (dump->parsed()) return cmd_dump(dump_r, ir, dot, glsl, dump_backend);
    if (explain->parsed()) return cmd_explain(explain_r, backend);
    if (bench->parsed()) return cmd_bench(bench_r, bench_backends, repeat);
    if (viz->parsed()) return cmd_viz(viz_r, backend, png_dir, labels);
    if (train->parsed()) return cmd_train(train_f);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "qkv: %s\n", e.what());
    return 2;
  } catch (const qkv::ShapeError& e) {
    std::fprintf(stderr, "qkv: %s\n", e.what());
    return 2;
  } catch (const qkv::IoError& e) {
    std::fprintf(stderr, "qkv: %s\n", e.what());
    return 2;
  } catch (const qkv::UnsupportedError& e) {
    std::fprintf(stderr, "qkv: %s\n", e.what());
    return 2;
  } catch (const qkv::Error& e) {
    std::fprintf(stderr, "qkv: %s\n", e.what());
    return 1;
  }
  return 0;
}
