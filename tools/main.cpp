// The qkv program: list, run, check, inspect, benchmark, draw and train attention models on any
// backend. Exit status: 0 success, 1 a failure (a check outside its budget, a backend error),
// 2 bad usage or input.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <filesystem>
#include <new>
#include <string_view>
#include <utility>

#include "backends/backend.hpp"
#include "distributed/communicator.hpp"
#include "models/models.hpp"
#include "tools/commands.hpp"

namespace {

using qkv::tool::Request;

/// --seed: a non-negative integer (CLI11 would wrap -1 to 2^64 - 1).
void add_seed_option(CLI::App* app, std::uint64_t& seed, const char* help) {
  const CLI::Validator whole_number(
      [](std::string& text) {
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        return digits ? std::string() : "a seed is a whole number >= 0, got '" + text + "'";
      },
      "");
  app->add_option("--seed", seed, help)->capture_default_str()->check(whole_number);
}

/// NAME=VALUE options as given, turned into Request maps after parsing.
struct RawPairs {
  std::vector<std::string> set, in, dims;
};
std::deque<std::pair<Request*, RawPairs>> g_requests;  // a deque: the options keep references into it

/// The options every model command shares. `grad_help` says what --grad does for this command;
/// empty where it does not apply.
void add_model_options(CLI::App* app, Request& r, const char* grad_help) {
  RawPairs* raw = &g_requests.emplace_back(&r, RawPairs{}).second;
  app->add_option("model", r.target,
                  "a built-in model (qkv models), a graph's IR text FILE.qkv (qkv dump --ir writes one), or a model folder as "
                  "transformers saves it (config.json, model.safetensors, tokenizer.json)")
      ->required();
  app->add_option("--prompt", r.prompt, "a model folder's input: text its tokenizer makes into input_ids (default: random ids, --dim B, T)");
  app->add_option("--set", raw->set, "a model option: NAME=VALUE (qkv models lists them)");
  app->add_option("--in", raw->in,
                  "an input: NAME=FILE.npy, or NAME=FILE.safetensors[:TENSOR] (its tensor NAME unless TENSOR is given; random from --seed "
                  "when not given)");
  app->add_option("--weights", r.weights, "parameters: a .safetensors file or a folder of NAME.npy, under PyTorch's names");
  app->add_option("--dim", raw->dims, "the size of a named dim no input gives: NAME=SIZE");
  add_seed_option(app, r.seed, "seed of the random inputs and parameters");
  app->add_option("--dtype", r.dtype, "a built-in model's float values in f32, f16 or bf16 (each op computes in f32 and rounds its result)")
      ->capture_default_str();
  if (grad_help[0]) {
    auto* grad = app->add_flag("--grad", r.grad, grad_help);
    app->add_flag("--jvp", r.jvp,
                  "forward mode instead: inputs t_<input>, each float input's tangent (random unless given with --in), outputs t_<output>, "
                  "each output's Jacobian-vector product")
        ->excludes(grad);
  }
}

/// The exit status and one-line message of every error qkv reports: 2 for what the user can fix
/// (usage, input files, shapes, an unsupported request), 1 for failures (a backend, memory, our
/// own bug). No exception leaves main unnamed.
std::pair<int, std::string> describe(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const qkv::Error& e) {
    return {qkv::exit_code(e), e.what()};
  } catch (const std::filesystem::filesystem_error& e) {
    return {2, (e.path1().empty() ? std::string("file system") : e.path1().string()) + ": " + e.code().message()};
  } catch (const std::bad_alloc&) {
    return {1, "out of memory"};
  } catch (const std::exception& e) {
    return {1, std::string("internal error: ") + e.what() + " (please report it)"};
  } catch (...) {
    return {1, "internal error: an unknown exception (please report it)"};
  }
}

/// Says what went wrong and returns the exit status. Under mpirun, one rank's error ends the
/// whole job (the other ranks would wait for it in their next collective).
int report(std::exception_ptr error) {
  const auto [code, message] = describe(error);
  if (qkv::distributed::launched_by_mpi() && qkv::distributed::Communicator::world().size() > 1)
    qkv::distributed::Communicator::world().abort(code, message);
  std::fprintf(stderr, "qkv: %s\n", message.c_str());
  return code;
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
  std::string out_dtype;
  auto* run = app.add_subcommand("run",
                                 "run a model on .npy or .safetensors inputs and write its outputs to .npy or .safetensors files; under mpirun, "
                                 "sequence-parallel (each rank holds N/P rows, attention as ring attention)");
  add_model_options(run, run_r, "run the backward graph: inputs d<output> (random unless given), outputs d_<input>");
  run->add_option("--backend", backend, backend_help);
  run->add_option("--out", outs, "an output to write: NAME=FILE.npy, or NAME=FILE.safetensors (several outputs may share one, each under its name)");
  run->add_option("--out-dtype", out_dtype, "write the float outputs in f32, f16 or bf16 (f32 widens a bf16 output for .npy)");

  Request check_r;
  std::string backends = "reference,cpu,vulkan", dump_dir;
  auto* check = app.add_subcommand("check", "run a model (or all) on each backend and compare with the float64 reference");
  add_model_options(check, check_r, "check the backward graph (gradients) instead of the forward");
  check->add_option("--backend", backends, "a backend, a comma-separated list, or all")->capture_default_str();
  double budget_factor = 8.0;
  check->add_option("--budget-factor", budget_factor, "budget = this x a plain float32 run's error, plus a few ulps")->capture_default_str();
  check->add_option("--dump-dir", dump_dir, "on failure, write the first failing node's inputs and a command reproducing it here");

  Request dump_r;
  bool ir = false, dot = false, glsl = false;
  std::string storage;
  auto* dump = app.add_subcommand("dump", "print a model's IR, Graphviz drawing, generated shaders, storage plan or backward graph");
  add_model_options(dump, dump_r, "the backward graph instead of the forward");
  dump->add_flag("--ir", ir, "the IR text (default); qkv run FILE.qkv runs it");
  dump->add_flag("--dot", dot, "a Graphviz DOT drawing");
  dump->add_flag("--glsl", glsl, "the GLSL compute shaders the vulkan backend generates for the graph");
  dump->add_option("--storage", storage,
                   "the storage plan of backend NAME's executable: per value of its lowered graph, the dtype its storage holds, "
                   "the views and the values written in place by another value's kernel")
      ->type_name("NAME");

  Request explain_r;
  auto* explain = app.add_subcommand("explain", "per node: the kernel chosen, FLOPs, bytes; totals; whether the score matrix is materialised");
  add_model_options(explain, explain_r, "explain the backward graph instead of the forward");
  explain->add_option("--backend", backend, backend_help);
  bool explain_profile = false;
  explain->add_flag("--profile", explain_profile, "each kernel's median device time over 7 runs (vulkan, from timestamp queries)");

  Request bench_r;
  std::string bench_backends = backend;
  int repeat = 20;
  auto* bench = app.add_subcommand("bench", "median time and GFLOP/s over repeated runs");
  add_model_options(bench, bench_r, "time the backward graph (gradients) instead of the forward");
  bench->add_option("--backend", bench_backends, "a backend, a comma-separated list, or all");
  bench->add_option("--repeat", repeat, "timed runs")->capture_default_str();
  bool profile = false;
  bench->add_flag("--profile", profile, "per kernel: its median device time and share (vulkan, from timestamp queries)");

  Request viz_r;
  qkv::tool::VizFlags viz_f;
  auto* viz = app.add_subcommand("viz",
                                 "attention weights as figures (heads side by side, causal next to full, the positional encoding) in PNG, SVG "
                                 "or PDF, and an interactive explorer as one HTML file");
  add_model_options(viz, viz_r, "");
  viz->add_option("--backend", backend, backend_help);
  viz->add_option("--dir,--png-dir", viz_f.dir, "folder to write the figures to (made if missing)");
  viz->add_option("--format", viz_f.formats, "figure formats, comma-separated: png, svg, pdf")->capture_default_str();
  viz->add_option("--html", viz_f.html, "write the interactive attention explorer to this HTML file (self-contained, opens offline)");
  viz->add_option("--labels", viz_f.labels,
                  "token labels, comma-separated (queries down, keys across); a built-in model's sequence is as long as the labels");
  qkv::tool::TrainFlags train_f;
  train_f.backend = backend;
  auto* train = app.add_subcommand(
      "train",
      "train a one-layer causal transformer on the copy task, or fine-tune a model folder on a text (MODEL_DIR --text FILE --save DIR), "
      "with generated backward graphs; data-parallel under mpirun");
  qkv::tool::FinetuneFlags finetune_f;
  train->add_option("model", finetune_f.model, "a decoder's model folder to fine-tune (as transformers saves one); none: the copy task");
  train->add_option("--text", finetune_f.text, "fine-tuning: the text file to learn the next tokens of");
  train->add_option("--save", finetune_f.save, "fine-tuning: write the trained model folder here (transformers' from_pretrained loads it)");
  train->add_option("--seq", finetune_f.seq, "fine-tuning: tokens per sequence")->capture_default_str();
  train->add_option("--weight-decay", finetune_f.weight_decay, "fine-tuning: AdamW's weight decay")->capture_default_str();
  train->add_option("--max-grad-norm", finetune_f.max_grad_norm, "fine-tuning: clip the gradients' global norm to this (0: no clipping)")
      ->capture_default_str();
  train->add_option("--backend", train_f.backend, backend_help + "; under mpirun (data-parallel), a list a,b gives rank i the i-th, cycling");
  train->add_option("--steps", train_f.steps, "optimizer steps (the copy task: SGD; fine-tuning: AdamW, 20 by default)")->capture_default_str();
  train->add_option("--batch", train_f.batch, "sequences per step")->capture_default_str();
  train->add_option("--lr", train_f.lr, "learning rate")->capture_default_str();
  add_seed_option(train, train_f.seed, "seed of the parameters and batches");
  train->add_option("--plot,--png", train_f.plot, "write the loss curve to this file: .png, .svg or .pdf");
  train
      ->add_option("--dtype", train_f.dtype,
                   "f32, or f16 or bf16 for mixed precision: matmuls and attention in it, f32 master parameters (f16 with dynamic "
                   "loss scaling)")
      ->capture_default_str();

  qkv::tool::GenerateFlags generate_f;
  generate_f.backend = backend;
  auto* generate = app.add_subcommand("generate", "continue a prompt with a model folder's model (as transformers saves one), streaming the text");
  generate->add_option("model", generate_f.model, "the model folder: config.json, model.safetensors, tokenizer.json")->required();
  generate
      ->add_option("--prompt", generate_f.prompts,
                   "the text to continue (repeatable: the prompts are continued together, each decode step one batch)")
      ->required();
  generate->add_option("--backend", generate_f.backend, backend_help);
  generate->add_option("--max-tokens", generate_f.max_tokens, "new tokens at most (fewer where the model's positions end)")->capture_default_str();
  generate->add_option("--temperature", generate_f.temperature, "0 picks the most likely token; above 0 samples from softmax(logits / T)")
      ->capture_default_str();
  generate->add_option("--top-k", generate_f.top_k, "sample among the k most likely tokens (0: all)")->capture_default_str();
  generate->add_option("--top-p", generate_f.top_p, "sample among the most likely tokens whose probability adds up to p")->capture_default_str();
  add_seed_option(generate, generate_f.seed, "seed of the sampling");
  generate->add_flag("--ignore-eos", generate_f.ignore_eos, "go on past the model's end-of-text token");
  generate->add_option("--page-size", generate_f.page_size,
                       "positions per page of the paged key/value cache, which the sequences take as they grow and give back as they end (0: "
                       "one contiguous cache per sequence, sized for the longest; default: 16 on cpu and vulkan, whose attention reads the "
                       "pages where they are, 0 on the reference, which gathers them first)");
  generate
      ->add_option("--cache-pages", generate_f.cache_pages,
                   "the paged cache's pages (0: enough for every prompt at once); fewer make prompts wait for others to end and give "
                   "theirs back")
      ->capture_default_str();

  qkv::tool::EmbedFlags embed_f;
  embed_f.backend = backend;
  auto* embed =
      app.add_subcommand("embed", "sentence embeddings from an encoder's model folder (all-MiniLM-L6-v2 and its kind), as sentence-transformers");
  embed->add_option("model", embed_f.model, "the model folder: config.json, model.safetensors, tokenizer.json")->required();
  embed->add_option("--text", embed_f.texts, "a text to embed (repeatable)");
  embed->add_option("--file", embed_f.file, "texts to embed, one a line");
  embed->add_option("--backend", embed_f.backend, backend_help);
  embed->add_option("--out", embed_f.out, "write the embeddings [texts, dims] to this .npy file");

  qkv::tool::FuzzFlags fuzz_f;
  std::string fuzz_backends = "reference,cpu,vulkan";
  auto* fuzz = app.add_subcommand(
      "fuzz", "random graphs from the op registry on every backend against the float64 reference; a failure is shrunk and written as a repro");
  fuzz->add_option("--graphs", fuzz_f.graphs, "how many graphs")->capture_default_str();
  fuzz->add_option("--ops", fuzz_f.ops, "ops drawn per graph")->capture_default_str();
  add_seed_option(fuzz, fuzz_f.seed, "seed of the first graph (graph i uses seed + i)");
  fuzz->add_option("--backend", fuzz_backends, "a backend, a comma-separated list, or all")->capture_default_str();
  fuzz->add_flag("--grad", fuzz_f.grad, "also check each graph's backward graph");
  fuzz->add_option("--budget-factor", fuzz_f.budget_factor, "budget = this x a plain float32 run's error, plus a few ulps")->capture_default_str();
  fuzz->add_option("--max-failures", fuzz_f.max_failures, "stop after this many failing graphs")->capture_default_str();
  fuzz->add_option("--dump-dir", fuzz_f.dump_dir, "write each failure's smallest graph, its inputs and the command that reproduces it here");

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
  // The docs' tests (tests/doc/doc_blocks.py) check that each command they show parses.
  if (const char* parse_only = std::getenv("QKV_PARSE_ONLY"); parse_only && std::string_view(parse_only) == "1") return 0;
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
    if (run->parsed()) return cmd_run(run_r, backend, outs, out_dtype);
    if (check->parsed()) return cmd_check(check_r, backends, dump_dir, budget_factor);
    if (dump->parsed()) return cmd_dump(dump_r, ir, dot, glsl, storage);
    if (explain->parsed()) return cmd_explain(explain_r, backend, explain_profile);
    if (bench->parsed()) return cmd_bench(bench_r, bench_backends, repeat, profile);
    if (viz->parsed()) return cmd_viz(viz_r, backend, viz_f);
    if (train->parsed() && !finetune_f.model.empty()) {
      finetune_f.backend = train_f.backend.empty() ? backend : train_f.backend;
      // --steps, --batch, --lr and --seed as given (fine-tuning has defaults of its own).
      if (train->count("--steps")) finetune_f.steps = train_f.steps;
      if (train->count("--batch")) finetune_f.batch = train_f.batch;
      if (train->count("--lr")) finetune_f.lr = train_f.lr;
      finetune_f.seed = train_f.seed;
      return cmd_finetune(finetune_f);
    }
    if (train->parsed()) {
      if (!finetune_f.text.empty() || !finetune_f.save.empty())
        throw qkv::UsageError("--text and --save are for fine-tuning a model folder (qkv train MODEL_DIR ...)");
      return cmd_train(train_f);
    }
    if (fuzz->parsed()) return cmd_fuzz(fuzz_f, backend_list(fuzz_backends));
    if (generate->parsed()) return cmd_generate(generate_f);
    if (embed->parsed()) return cmd_embed(embed_f);
  } catch (...) {
    return report(std::current_exception());
  }
  return 0;
}
