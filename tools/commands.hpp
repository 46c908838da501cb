// The qkv commands, one function each (tools/commands_*.cpp); main.cpp parses the command line.
#pragma once

#include <string>
#include <vector>

#include "tools/prepare.hpp"

namespace qkv::tool {

int cmd_devices();
int cmd_ops();
int cmd_models();
int cmd_run(const Request& r, const std::string& backend, const std::vector<std::string>& outs, const std::string& out_dtype);
int cmd_check(const Request& r, const std::string& backends, const std::string& dump_dir, double budget_factor);
int cmd_dump(const Request& r, bool ir, bool dot, bool glsl, const std::string& storage_backend);
/// With `profile`, each kernel's median device time too (backends that time their kernels).
int cmd_explain(const Request& r, const std::string& backend, bool profile = false);
int cmd_bench(const Request& r, const std::string& backends, int repeat, bool profile);
struct VizFlags {
  std::string dir;              // --dir: the figures' folder
  std::string formats = "png";  // --format: comma-separated png, svg, pdf
  std::string html;             // --html: the explorer's file
  std::string labels;           // --labels: comma-separated token labels
};
int cmd_viz(const Request& r, const std::string& backend, const VizFlags& flags);
struct TrainFlags {
  std::string backend;
  int steps = 100;
  int batch = 32;
  double lr = 0.3;
  std::uint64_t seed = 1;
  std::string plot;           // --plot: the loss curve's file (.png, .svg, .pdf)
  std::string dtype = "f32";  // f16 or bf16: mixed precision (f32 parameters; f16 scales its loss)
};
int cmd_train(const TrainFlags& f);
/// Fine-tuning a decoder's model folder on a text file (qkv train MODEL_DIR --text FILE).
struct FinetuneFlags {
  std::string model;
  std::string text;
  std::string save;  // the trained model folder
  std::string backend;
  int steps = 20;
  int batch = 4;
  int seq = 32;  // tokens per sequence
  double lr = 1e-3;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;
  std::uint64_t seed = 1;
};
int cmd_finetune(const FinetuneFlags& f);
struct GenerateFlags {
  std::string model;                 // a model folder
  std::vector<std::string> prompts;  // several: continued together, one batch
  std::string backend;
  std::int64_t max_tokens = 32;
  double temperature = 0.0;
  std::int64_t top_k = 0;
  double top_p = 1.0;
  std::uint64_t seed = 1;
  bool ignore_eos = false;
  std::int64_t page_size = -1;   // the paged cache's positions per page; 0: a contiguous cache; -1: 16 on cpu, else 0
  std::int64_t cache_pages = 0;  // the paged cache's pages; 0: as many as every prompt needs at once
};
int cmd_generate(const GenerateFlags& f);
struct EmbedFlags {
  std::string model;  // an encoder's model folder
  std::vector<std::string> texts;
  std::string file;  // a text a line
  std::string backend;
  std::string out;  // .npy [texts, dims]
};
int cmd_embed(const EmbedFlags& f);
struct FuzzFlags {
  int graphs = 200;
  int ops = 6;
  std::uint64_t seed = 1;
  bool grad = false;
  double budget_factor = 8.0;
  int max_failures = 1;
  std::string dump_dir;
};
int cmd_fuzz(const FuzzFlags& f, const std::vector<std::string>& backends);
/// The backends a --backend list names ("all" for every one); UsageError for an unknown name.
std::vector<std::string> backend_list(const std::string& list);

}  // namespace qkv::tool
