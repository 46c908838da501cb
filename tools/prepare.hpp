// What the qkv commands share: a model (built-in, or a graph's IR text) made into a graph and its
// inputs, from files, a weights file and a seed.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "ir/graph.hpp"

namespace qkv::tool {

/// Bad usage or input: exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// NAME=VALUE pairs from repeated options; `what` names the option in errors.
std::map<std::string, std::string> pairs(const std::vector<std::string>& items, const char* what);
std::string shape_string(const std::vector<std::int64_t>& s);

struct Request {
  std::string target;                      // a model name or FILE.qkv
  std::map<std::string, std::string> set;  // --set
  std::map<std::string, std::string> in;   // --in NAME=FILE.npy
  std::map<std::string, std::string> dims; // --dim NAME=SIZE (sizes of named dims without inputs)
  std::string weights;                     // --weights FILE.safetensors or DIR of NAME.npy
  std::uint64_t seed = 1;
  bool grad = false;                       // the backward graph: outputs d_<input>, inputs d<output>
};

struct Prepared {
  std::string title;             // "mha (embed=32, heads=4, causal=false)"
  ir::Graph graph;               // forward, or backward with --grad
  backend::TensorMap inputs;     // every input of `graph`
  std::vector<std::string> data; // inputs that are data (the rest are parameters)
  std::map<std::string, std::string> sources;  // input -> where it came from (file, weights, seed)
  int promoted = 0;              // leading dims of size 1 added to every data file (removed from outputs)
};

/// The forward (or backward) graph of a built-in model or a FILE.qkv, and every input it needs:
/// from --in files (a file of lower rank gets leading dims of size 1), from --weights, or random
/// from the seed. Throws UsageError for what the user can fix.
Prepared prepare(const Request& r);

/// Inputs for `graph` that `given` lacks, random from `seed` (named dims from `dims`, others 8).
void fill_missing(const ir::Graph& graph, backend::TensorMap& given, std::map<std::string, std::int64_t> dims, std::uint64_t seed);

}  // namespace qkv::tool
