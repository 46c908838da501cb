// qkv run, dump, models, devices and ops.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include "backends/vulkan/vulkan_backend.hpp"
#include "distributed/sequence_parallel.hpp"
#include "io/file.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "ir/gradients.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/storage_plan.hpp"
#include "models/models.hpp"
#include "sweeps/op_cases.hpp"
#include "tools/commands.hpp"

namespace qkv::tool {

namespace {

/// Prints a result whose matrices are small enough to read (at most 16 x 16, 4 of them).
void print_small(const std::string& name, const Tensor& t) {
  if (t.rank() < 2) {
    if (t.numel() <= 16) {
      std::printf("%s:", name.c_str());
      for (std::int64_t i = 0; i < t.numel(); ++i) std::printf(" %.4f", t.at(i));
      std::printf("\n");
    }
    return;
  }
  const std::int64_t rows = t.shape().end()[-2], cols = t.shape().back(), batches = t.numel() / std::max<std::int64_t>(rows * cols, 1);
  if (rows > 16 || cols > 16 || batches > 4) return;
  std::printf("%s:\n", name.c_str());
  for (std::int64_t b = 0; b < batches; ++b) {
    for (std::int64_t i = 0; i < rows; ++i) {
      std::printf("  ");
      for (std::int64_t j = 0; j < cols; ++j) std::printf(" %8.4f", t.at((b * rows + i) * cols + j));
      std::printf("\n");
    }
    if (b + 1 < batches) std::printf("\n");
  }
}

}  // namespace

int cmd_devices() {
  for (const auto& s : backend::probe_backends())
    std::printf("%-10s %-11s %s\n", s.name.c_str(), s.available ? "available" : "unavailable", s.detail.c_str());
  try {
    auto devices = backend::vulkan_devices();
    for (std::size_t i = 0; i < devices.size(); ++i) {
      const auto& d = devices[i];
      std::printf("  vulkan device %zu: %s (%s, Vulkan %s)\n    %s\n", i, d.name.c_str(), d.type.c_str(), d.api.c_str(), d.capabilities().c_str());
    }
  } catch (const Error&) {}
  return 0;
}

int cmd_ops() {
  const auto backends = backend::backend_names();
  std::printf("| op | inputs |");
  for (const auto& name : backends) std::printf(" %s |", name.c_str());
  std::printf(" gradient | meaning |\n|---|---|");
  for (std::size_t i = 0; i < backends.size(); ++i) std::printf("---|");
  std::printf("---|---|\n");
  for (ir::Op op : ir::all_ops()) {
    const auto& info = ir::op_info(op);
    ir::Graph g = ir::case_graph(op, ir::op_cases(op).at(0));
    const ir::Node& node = g.node(g.output("out"));
    std::printf("| `%s` | %zu%s |", std::string(info.name).c_str(), ir::fixed_operands(op), info.arity < 0 ? "+" : "");
    for (const auto& name : backends) std::printf(" %s |", backend::backend_supports(name, node) ? "kernel" : "decomposed");
    const auto grad = ir::gradient_info(op);
    const char* kind = grad.kind == ir::GradKind::rule        ? "rule"
                       : grad.kind == ir::GradKind::zero      ? "none"
                       : grad.kind == ir::GradKind::decompose ? "via decomposition"
                                                              : "MISSING";
    std::printf(" %s%s%s | %s |\n", kind, grad.why.empty() ? "" : ": ", std::string(grad.why).c_str(), std::string(info.doc).c_str());
  }
  return 0;
}

int cmd_models() {
  for (const auto& m : models::all_models()) {
    std::printf("%s\n  %s\n", m.name.c_str(), m.summary.c_str());
    const ir::Graph g = m.build(models::resolve_options(m, {}), m.dims);  // the defaults; no inputs are made
    std::string data, params;
    for (ir::ValueId v : g.inputs()) {
      const std::string item = g.node(v).name + " " + g.type_string(v);
      const bool is_data = std::find(m.data.begin(), m.data.end(), g.node(v).name) != m.data.end();
      (is_data ? data : params) += (is_data ? data : params).empty() ? item : ", " + item;
    }
    std::string outs;
    for (const auto& [name, v] : g.outputs()) outs += (outs.empty() ? "" : ", ") + name + " " + g.type_string(v);
    std::printf("  inputs:  %s\n", data.c_str());
    if (!params.empty()) std::printf("  weights: %s\n", params.c_str());
    std::printf("  outputs: %s\n", outs.c_str());
    for (const auto& o : m.options) std::printf("  --set %s=%s  %s\n", o.name.c_str(), o.default_value.c_str(), o.help.c_str());
    std::printf("\n");
  }
  return 0;
}

namespace {

/// What --out writes: each output asked for, its file, and the dtype it is written in (the
/// graph's, or --out-dtype's for a float output). Checked before any work: an output the graph
/// lacks, a file that is neither .npy nor .safetensors, a dtype .npy cannot hold, two outputs in
/// one .npy, an unwritable destination.
struct OutPlan {
  std::map<std::string, std::string> files;  // output -> file
  std::map<std::string, DType> dtypes;       // output -> dtype written
};

OutPlan plan_outputs(const Prepared& p, const std::vector<std::string>& outs, const std::string& out_dtype) {
  OutPlan plan;
  plan.files = pairs(outs, "--out");
  std::optional<DType> convert;
  if (!out_dtype.empty()) {
    convert = parse_dtype(out_dtype);
    if (!convert || !is_float(*convert) || *convert == DType::f64) throw UsageError("--out-dtype " + out_dtype + ": f32, f16 or bf16");
  }
  std::map<std::string, std::string> npy_owner;  // .npy file -> the output it holds
  for (const auto& [name, file] : plan.files) {
    const auto found = std::find_if(p.graph.outputs().begin(), p.graph.outputs().end(), [&](const auto& o) { return o.first == name; });
    if (found == p.graph.outputs().end()) {
      std::string list;
      for (const auto& [o, v] : p.graph.outputs()) list += (list.empty() ? "" : ", ") + o;
      throw UsageError(p.title + " has no output '" + name + "' (outputs: " + list + ")");
    }
    const DType own = p.graph.node(found->second).dtype;
    const DType written = convert && is_float(own) ? *convert : own;
    plan.dtypes[name] = written;
    const std::string what = "--out " + name + "=" + file;
    if (file.ends_with(".npy")) {
      if (written == DType::bf16 && convert) throw UsageError(what + " with --out-dtype bf16: .npy cannot hold bf16: write a .safetensors file");
      if (written == DType::bf16)
        throw UsageError(what + ": '" + name + "' is bf16, which .npy cannot hold: write a .safetensors file, or widen it with --out-dtype f32");
      if (const auto [at, fresh] = npy_owner.emplace(file, name); !fresh)
        throw UsageError(what + ": '" + at->second +
                         "' is written there too, and a .npy file holds one tensor: write a .safetensors file for several");
    } else if (!file.ends_with(".safetensors")) {
      throw UsageError(what + ": a .npy or .safetensors file");
    }
    io::check_writable(file);  // before any work: a bad destination fails the run at once
  }
  return plan;
}

}  // namespace

int cmd_run(const Request& r, const std::string& backend_name, const std::vector<std::string>& outs, const std::string& out_dtype) {
  Prepared p = prepare(r);
  const OutPlan out_plan = plan_outputs(p, outs, out_dtype);
  const auto& out_files = out_plan.files;
  auto be = backend::create(backend_name);
  // Under mpirun: sequence-parallel, each rank computing its rows of the sequence (N, and M where
  // keys are the same sequence), attention as ring attention; only the outputs asked for with
  // --out (the weights, say, would keep a score matrix), gathered on rank 0, which reports.
  distributed::Communicator& comm = distributed::Communicator::world();
  std::unique_ptr<backend::Executable> exe;
  std::unique_ptr<distributed::SequenceParallel> parallel;
  if (comm.size() > 1) {
    std::vector<std::string> keep;
    for (const auto& [name, file] : out_files) keep.push_back(name);
    if (!keep.empty()) p.graph = ir::select_outputs(p.graph, keep);
    parallel = std::make_unique<distributed::SequenceParallel>(comm, *be, p.graph, std::vector<std::string>{"N", "M"});
  } else {
    exe = be->compile(p.graph);
  }
  auto t0 = std::chrono::steady_clock::now();
  backend::TensorMap result = parallel ? parallel->run(p.inputs) : exe->run(p.inputs);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (comm.rank() != 0) return 0;
  // Every output file is written, or none; the outputs sharing a .safetensors file under their names.
  io::OutputBatch files;
  std::map<std::string, io::TensorFile> safetensors;
  for (const auto& [name, file] : out_files) {
    Tensor t = as_given(p, result.at(name));
    if (t.dtype() != out_plan.dtypes.at(name)) t = t.to(out_plan.dtypes.at(name));
    if (file.ends_with(".npy")) files.add(file, io::format_npy(t));
    else safetensors[file].emplace(name, std::move(t));
  }
  for (const auto& [file, tensors] : safetensors) files.add(file, io::format_safetensors(tensors));
  files.commit();
  std::printf("%s on %s (%s)%s: %.3f ms\n", p.title.c_str(), be->name().c_str(), be->device().c_str(),
              parallel ? (", sequence-parallel over " + std::to_string(comm.size()) + " ranks").c_str() : "", ms);
  for (ir::ValueId v : p.graph.inputs()) {
    const auto& name = p.graph.node(v).name;
    std::printf("  in  %-24s %-16s from %s\n", name.c_str(), shape_string(p.inputs.at(name).shape()).c_str(), p.sources[name].c_str());
  }
  for (const auto& [name, v] : p.graph.outputs()) {
    Tensor t = as_given(p, result.at(name));
    auto f = out_files.find(name);
    std::printf("  out %-24s %-16s %s\n", name.c_str(), shape_string(t.shape()).c_str(),
                f != out_files.end() ? ("-> " + f->second).c_str() : "(not written; --out NAME=FILE.npy or .safetensors)");
  }
  for (const auto& [name, v] : p.graph.outputs()) print_small(name, as_given(p, result.at(name)));
  return 0;
}

int cmd_dump(const Request& r, bool ir, bool dot, bool glsl, const std::string& storage_backend) {
  Prepared p = prepare(r);
  if (dot) std::fputs(ir::to_dot(p.graph).c_str(), stdout);
  if (glsl) {
    std::fputs(backend::vulkan_shaders(p.graph).c_str(), stdout);  // the only backend that runs shaders
  }
  if (!storage_backend.empty()) {  // the plan of the graph the backend runs (lowered for it)
    auto be = backend::create(storage_backend);
    const auto exe = be->compile(p.graph);
    const ir::Graph& lowered = exe->graph();
    std::printf("# storage plan of %s on %s (%s)\n%s", p.title.c_str(), be->name().c_str(), be->device().c_str(),
                ir::print_storage(lowered, be->storage_plan(lowered)).c_str());
  }
  if (ir || (!dot && !glsl && storage_backend.empty())) std::fputs(ir::print(p.graph).c_str(), stdout);
  return 0;
}

}  // namespace qkv::tool
