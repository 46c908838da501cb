// What the qkv commands share: a model (built-in, or a graph's IR text) made into a graph and its
// inputs, from files, a weights file and a seed.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "ir/error.hpp"
#include "ir/graph.hpp"

namespace qkv::tool {

/// NAME=VALUE pairs from repeated options; `what` names the option in errors, and a NAME given
/// twice is one.
std::map<std::string, std::string> pairs(const std::vector<std::string>& items, const char* what);
std::string shape_string(const std::vector<std::int64_t>& s);

struct Request {
  std::string target;                                 // a model name, FILE.qkv, or a model folder (config.json, model.safetensors)
  std::map<std::string, std::string> set;             // --set
  std::map<std::string, std::string> in;              // --in NAME=FILE.npy
  std::map<std::string, std::string> dims;            // --dim NAME=SIZE (sizes of named dims without inputs)
  std::map<std::string, std::int64_t> fallback_dims;  // sizes of the graph's named dims that --dim does not give (qkv viz: N from --labels)
  std::string weights;                                // --weights FILE.safetensors or DIR of NAME.npy
  std::uint64_t seed = 1;
  bool grad = false;               // the backward graph: outputs d_<input>, inputs d<output>
  bool jvp = false;                // forward mode: inputs t_<input>, outputs t_<output> (ir::build_jvp)
  std::string dtype = "f32";       // --dtype: a built-in model's or model folder's float values in f16 or bf16
  std::string prompt;              // --prompt: a model folder's input text (its tokenizer makes the ids)
  bool attention_weights = false;  // a model folder's graph also outputs each layer's "weights.<layer>" (qkv viz)
};

struct Prepared {
  std::string title;                           // "mha (embed=32, heads=4, causal=false)"
  ir::Graph graph;                             // forward, or backward with --grad, or with tangents with --jvp
  backend::TensorMap inputs;                   // every input of `graph`
  std::vector<std::string> data;               // inputs that are data (the rest are parameters)
  std::map<std::string, std::string> sources;  // input -> where it came from (file, weights, seed)
  int promoted = 0;                            // leading dims of size 1 added to every data file (removed from outputs)
  std::vector<std::int64_t> batch;             // leading dims of the files folded into the graph's batch dim B (restored in outputs)
};

/// The forward (or backward) graph of a built-in model or a FILE.qkv, and every input it needs:
/// from --in files (a file of lower rank gets leading dims of size 1), from --weights, or random
/// from the seed. Throws UsageError for what the user can fix.
Prepared prepare(const Request& r);

/// An output of `p.graph` in the shape the inputs were given: without the leading dims of size 1
/// prepare() added, with the folded batch dims restored.
Tensor as_given(const Prepared& p, const Tensor& t);

/// The size of --dim NAME=VALUE or another flag's size: a whole number >= 0, else UsageError
/// naming the flag.
std::int64_t parse_size(const std::string& flag, const std::string& name, const std::string& value);

/// Binds `inputs` to `g`'s shapes; a ShapeError names where each tensor it mentions came from.
void check_binding(const ir::Graph& g, const backend::TensorMap& inputs, const std::map<std::string, std::string>& sources);

/// Inputs for `graph` that `given` lacks, random from `seed` (named dims from `dims`, others 8).
void fill_missing(const ir::Graph& graph, backend::TensorMap& given, const std::map<std::string, std::int64_t>& dims, std::uint64_t seed);

}  // namespace qkv::tool
