// qkv check, explain and bench.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "backends/equivalence.hpp"
#include "backends/reference/reference_backend.hpp"
#include "distributed/sequence_parallel.hpp"
#include "io/file.hpp"
#include "io/npy.hpp"
#include "ir/bind.hpp"
#include "ir/op_cost.hpp"
#include "ir/printer.hpp"
#include "ir/region.hpp"
#include "ir/storage_plan.hpp"
#include "models/models.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"

namespace qkv::tool {

namespace {

std::vector<std::string> split_list(const std::string& list, const char* what) {
  std::vector<std::string> names;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) names.push_back(item);
  if (names.empty()) throw UsageError(std::string(what) + " lists nothing");
  return names;
}

}  // namespace

std::vector<std::string> backend_list(const std::string& list) {
  if (list == "all") return backend::backend_names();
  auto names = split_list(list, "--backend");
  for (const auto& n : names) {
    const auto known = backend::backend_names();
    if (std::find(known.begin(), known.end(), n) == known.end()) throw UsageError("no backend '" + n + "' (backends: reference, cpu, vulkan)");
  }
  return names;
}

namespace {

/// The graph with every float or bool value an output "v<i>", so each node can be compared.
ir::Graph every_value(const ir::Graph& g) {
  ir::Graph all = g;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    if (n.op == ir::Op::input || n.op == ir::Op::constant) continue;
    bool named = false;
    for (const auto& [o, v] : g.outputs()) named |= v == static_cast<ir::ValueId>(i);
    if (!named) all.set_output("v" + std::to_string(i), static_cast<ir::ValueId>(i));
  }
  return all;
}

/// The shapes of a backend's lowered graph `g` on a model's `inputs`: a half input is there f16
/// or bf16 (kept) or f32 (widened by the backend's boundary), as its lowering says.
std::vector<ir::Shape> shapes_as_run(const ir::Graph& g, const backend::TensorMap& inputs) {
  backend::TensorMap as_run = inputs;
  for (ir::ValueId v : g.inputs())
    if (auto it = as_run.find(g.node(v).name); it != as_run.end() && is_half(it->second.dtype()) && it->second.dtype() != g.node(v).dtype)
      it->second = it->second.to(g.node(v).dtype);
  return ir::bind_shapes(g, as_run);
}

/// Finds the first node whose value on `backend_name` leaves its budget, prints it, and with a
/// dump folder writes its operands (float64 reference values) and a one-node graph to re-run.
void localise(const ir::Graph& g, const backend::TensorMap& inputs, const std::string& backend_name, const std::string& dump_dir, double factor) {
  ir::Graph all = every_value(g);
  const auto shapes = ir::bind_shapes(g, inputs, true);
  backend::TensorMap oracle, plain, got;
  try {
    oracle = backend::make_reference_backend({backend::Precision::f64, true})->compile(all)->run(inputs);
    plain = backend::make_reference_backend({backend::Precision::f32, true})->compile(all)->run(inputs);
    got = backend::create(backend_name)->compile(all)->run(inputs);
  } catch (const Error& e) {
    std::printf("  (could not run every node of the graph on %s: %s)\n", backend_name.c_str(), e.what());
    return;
  }
  auto key = [&](std::size_t i) {
    for (const auto& [o, v] : all.outputs())
      if (v == static_cast<ir::ValueId>(i)) return o;
    return std::string();
  };
  for (std::size_t i = 0; i < g.size(); ++i) {
    const std::string k = key(i);
    if (k.empty() || !got.contains(k)) continue;
    auto c = backend::compare_output(k, got.at(k), oracle.at(k), plain.at(k), factor, nullptr, backend::computed_in(all, k));
    if (c.pass) continue;
    const ir::Node& n = g.nodes()[i];
    std::printf("  first node outside its budget on %s: %%%zu = %s : %s (max abs error %.3g, budget %.3g)\n", backend_name.c_str(), i,
                std::string(ir::op_name(n.op)).c_str(), g.type_string(static_cast<ir::ValueId>(i)).c_str(), c.max_abs_error, c.budget);
    if (dump_dir.empty()) {
      std::printf("  (--dump-dir DIR writes its inputs and a command that reproduces it)\n");
      return;
    }
    io::make_dirs(dump_dir);
    ir::Graph one;
    char factor_text[32];
    std::snprintf(factor_text, sizeof factor_text, "%g", factor);
    std::string cmd = "qkv check " + dump_dir + "/node.qkv --backend reference," + backend_name + " --budget-factor " + factor_text;
    std::vector<ir::ValueId> ins;
    for (std::size_t k2 = 0; k2 < n.inputs.size(); ++k2) {
      const ir::ValueId operand = n.inputs[k2];
      const std::string name = "x" + std::to_string(k2);
      const std::string ok = key(static_cast<std::size_t>(operand));
      Tensor value;
      if (g.node(operand).op == ir::Op::input) {
        value = inputs.at(g.node(operand).name);
      } else if (g.node(operand).op == ir::Op::constant) {
        value = Tensor(DType::f32, ir::to_vector(shapes[static_cast<std::size_t>(operand)]));
        for (std::int64_t e = 0; e < value.numel(); ++e) value.data<float>()[e] = static_cast<float>(ir::bound_value(g, g.node(operand), shapes));
      } else {
        value = oracle.at(ok);
      }
      if (value.dtype() == DType::f64) value = value.to(DType::f32);
      ir::Shape s;
      for (auto d : value.shape()) s.push_back(d);
      ins.push_back(one.add_input(name, value.dtype(), s));
      const std::string file = dump_dir + "/" + name + ".npy";
      io::write_npy(file, value);
      cmd += " --in " + name + "=" + file;
    }
    one.set_output("out", one.add(n.op, ins, n.attrs));
    io::write_file_atomic(dump_dir + "/node.qkv", ir::print(one));
    std::printf("  wrote its inputs and graph to %s; reproduce with:\n    %s\n", dump_dir.c_str(), cmd.c_str());
    return;
  }
  std::printf("  every node is within budget when computed separately: the failure comes from how %s fuses or schedules them\n",
              backend_name.c_str());
}

}  // namespace

namespace {
/// A backend by name; under mpirun, running every graph sequence-parallel over the job.
std::unique_ptr<backend::Backend> make_backend(distributed::Communicator& comm, const std::string& name) {
  auto b = backend::create(name);
  if (comm.size() == 1) return b;
  return distributed::sequence_parallel_backend(comm, std::move(b), {"N", "M"});
}
}  // namespace

int cmd_check(const Request& r, const std::string& backends, const std::string& dump_dir, double factor) {
  if (!(factor >= 0)) throw UsageError("--budget-factor must be >= 0");
  if (!dump_dir.empty()) io::check_writable_dir(dump_dir);
  std::vector<std::string> targets = r.target == "all" ? models::model_names() : std::vector<std::string>{r.target};
  const auto names = backend_list(backends);
  // Under mpirun each backend runs the model sequence-parallel, checked against one process's float64.
  distributed::Communicator& comm = distributed::Communicator::world();
  const bool lead = comm.rank() == 0;
  bool pass = true;
  Progress progress("check " + r.target + ": model", lead && targets.size() > 1 ? static_cast<std::int64_t>(targets.size()) : 0);
  for (std::size_t done = 0; done < targets.size(); ++done) {
    Request one = r;
    one.target = targets[done];
    Prepared p = prepare(one);
    auto report = backend::check_equivalence(p.graph, p.inputs, names, factor, [&](const std::string& name) { return make_backend(comm, name); });
    progress.clear();  // the report prints where the line was
    if (lead) {
      std::printf("%s, seed %llu, against the float64 reference%s:\n", p.title.c_str(), static_cast<unsigned long long>(r.seed),
                  comm.size() > 1 ? (", each backend sequence-parallel over " + std::to_string(comm.size()) + " ranks").c_str() : "");
      std::fputs(report.table().c_str(), stdout);
      std::printf("%s\n\n", report.pass() ? "all backends within budget" : "FAILED: a backend is outside its budget or did not run");
    }
    if (!report.pass()) {
      pass = false;
      if (comm.size() > 1) continue;  // localising bisects the graph in one process
      for (const auto& b : report.backends)
        if (!b.pass && b.error.empty()) localise(p.graph, p.inputs, b.backend, dump_dir, factor);
    }
    std::fflush(stdout);
    progress.update(static_cast<std::int64_t>(done + 1));
  }
  return pass ? 0 : 1;
}

int cmd_explain(const Request& r, const std::string& backend_name, bool profile) {
  Prepared p = prepare(r);
  auto be = backend::create(backend_name);
  auto exe = be->compile(p.graph);
  exe->set_profiling(profile);
  exe->run(p.inputs);
  const ir::Graph& g = exe->graph();
  auto shapes = shapes_as_run(g, p.inputs);
  // With --profile: each kernel's median device time over a few runs after the first.
  std::vector<double> device_ms(g.size(), -1.0);
  double device_total = 0;
  if (profile) {
    constexpr int kRuns = 7;
    std::vector<std::vector<double>> times(g.size());
    for (int i = 0; i < kRuns; ++i) {
      exe->run(p.inputs);
      for (const backend::KernelTime& t : exe->profile()) times[static_cast<std::size_t>(t.value)].push_back(t.seconds * 1e3);
    }
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (times[i].empty()) continue;
      std::sort(times[i].begin(), times[i].end());
      device_ms[i] = times[i][times[i].size() / 2];
      device_total += device_ms[i];
    }
  }
  std::printf("%s on %s (%s)\n", p.title.c_str(), be->name().c_str(), be->device().c_str());
  const ir::StoragePlan storage = be->storage_plan(g);
  std::vector<std::string> kernel(g.size());
  int width = 34;
  for (std::size_t i = 0; i < g.size(); ++i) {
    kernel[i] = be->kernel_name(g, static_cast<ir::ValueId>(i));
    width = std::max(width, static_cast<int>(kernel[i].size()));
  }
  std::printf("%-5s %-18s %-22s %-*s %12s %12s%s\n", "node", "op", "shape", width, "kernel", "MFLOP", "MB moved", profile ? "    device ms" : "");
  double flops = 0, bytes = 0;
  int kernels = 0, inlined = 0;  // vulkan's generated kernels, and the nodes fused into them
  std::string scores;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto v = static_cast<ir::ValueId>(i);
    const ir::Node& n = g.node(v);
    // Bytes its kernel reads and writes, in the dtypes their storage holds (2 bytes an element
    // for 16-bit storage): none for an input, a view or a value written by another value's
    // kernel (the storage plan's), or a node computed inside another's kernel (the backends name
    // those in parentheses).
    double moved = 0;
    auto held_bytes = [&](ir::ValueId x) {
      return static_cast<double>(dtype_size(storage.held(x))) * static_cast<double>(shapes[static_cast<std::size_t>(x)].numel());
    };
    if (storage.has_kernel(v) && !kernel[i].starts_with("(")) {
      moved = held_bytes(v);
      for (ir::ValueId in : be->kernel_reads(g, v)) moved += held_bytes(in);
    }
    const double f = ir::estimated_flops(g, v, shapes);
    flops += f;
    bytes += moved;
    if ((n.op == ir::Op::attention || n.op == ir::Op::masked_attention) && scores.empty())
      scores = "not materialised: fused attention at %" + std::to_string(i) + " streams key blocks";
    if (n.op == ir::Op::flex_attention && scores.empty())
      scores = "not materialised: fused flex attention at %" + std::to_string(i) + " streams key blocks, its modifier " +
               ir::region_expression(*n.region) + " applied to each tile";
    if (kernel[i].starts_with("glsl ")) ++kernels;
    if (kernel[i].starts_with("(in %")) ++inlined;
    std::printf("%%%-4zu %-18s %-22s %-*s %12.3f %12.3f", i, std::string(ir::op_name(n.op)).c_str(), shape_string(ir::to_vector(shapes[i])).c_str(),
                width, kernel[i].c_str(), f / 1e6, moved / 1e6);
    if (device_ms[i] >= 0) std::printf(" %12.4f", device_ms[i]);
    std::printf("\n");
    const std::string split = be->work_split(g, v, shapes);
    if (!split.empty()) std::printf("      %s\n", split.c_str());
  }
  if (scores.empty()) {  // no fused attention: a softmax of the model's graph holds its scores
    auto model_shapes = ir::bind_shapes(p.graph, p.inputs);
    for (std::size_t i = 0; i < p.graph.size() && scores.empty(); ++i)
      if (p.graph.nodes()[i].op == ir::Op::softmax)
        scores = "materialised: the softmax over " + shape_string(ir::to_vector(model_shapes[i])) + " (%" + std::to_string(i) +
                 " of the model's graph) is computed in full";
  }
  std::printf("total: %.3f MFLOP, %.3f MB moved, %.3f MB held for intermediates and outputs\n", flops / 1e6, bytes / 1e6,
              static_cast<double>(exe->planned_bytes()) / 1e6);
  if (kernels > 0 || inlined > 0) std::printf("kernels: %d, computing %d nodes more inside them (fused)\n", kernels, inlined);
  if (profile && device_total > 0) std::printf("device time: %.4f ms in kernels (median of 7 runs each; no uploads or downloads)\n", device_total);
  if (profile && device_total <= 0) std::printf("device time: %s does not time its kernels on this device\n", be->name().c_str());
  std::printf("score matrix: %s\n", scores.empty() ? "none (no attention in this graph)" : scores.c_str());
  std::printf("deterministic: %s\n", be->determinism().c_str());
  // Block sparsity as this run found it: the tiles each fused kernel skipped because every
  // score there is masked (from causality, a window, or the modifier over these inputs).
  for (const backend::TileCount& t : exe->tile_counts()) {
    std::printf("block sparsity: %%%d %s skipped %.1f%% of its %lld scores, in blocks wholly masked", t.value,
                std::string(ir::op_name(g.node(t.value).op)).c_str(), 100.0 * t.skipped_fraction(), static_cast<long long>(t.computed + t.skipped));
    if (t.unmasked > 0)  // FlexAttention's full blocks: kept whole, so their masks are not evaluated
      std::printf("; %.1f%% of those computed in blocks wholly kept, without evaluating the mask",
                  100.0 * static_cast<double>(t.unmasked) / static_cast<double>(t.computed));
    std::printf("\n");
  }
  return 0;
}

namespace {

/// The median of each kernel's device time over the runs, with its share of their sum: where
/// a backend's time goes (qkv bench --profile).
void print_profile(const backend::Backend& be, const ir::Graph& g, const std::vector<std::vector<backend::KernelTime>>& runs) {
  if (runs.empty() || runs.front().empty()) {
    std::printf("  (%s does not time its kernels on this device)\n", be.name().c_str());
    return;
  }
  std::vector<double> median(runs.front().size());
  for (std::size_t k = 0; k < median.size(); ++k) {
    std::vector<double> t;
    for (const auto& run : runs) t.push_back(run[k].seconds);
    std::sort(t.begin(), t.end());
    median[k] = t[t.size() / 2] * 1e3;
  }
  double total = 0;
  for (double m : median) total += m;
  std::printf("  %-5s %-20s %-44s %12s %7s\n", "node", "op", "kernel", "device ms", "share");
  for (std::size_t k = 0; k < median.size(); ++k) {
    const ir::ValueId v = runs.front()[k].value;
    std::printf("  %%%-4d %-20s %-44s %12.4f %6.1f%%\n", v, std::string(ir::op_name(g.node(v).op)).c_str(), be.kernel_name(g, v).c_str(), median[k],
                total > 0 ? 100.0 * median[k] / total : 0.0);
  }
  std::printf("  %-71s %12.4f (kernels only: no uploads or downloads)\n", "total", total);
}

}  // namespace

int cmd_bench(const Request& r, const std::string& backends, int repeat, bool profile) {
  if (repeat < 1) throw UsageError("--repeat must be at least 1");
  const auto names = backend_list(backends);  // before any output
  Prepared p = prepare(r);
  distributed::Communicator& comm = distributed::Communicator::world();  // under mpirun: sequence-parallel, rank 0 reports
  const bool lead = comm.rank() == 0;
  if (lead) {
    std::printf("%s: median of %d runs after one warm-up%s\n", p.title.c_str(), repeat,
                comm.size() > 1 ? (", sequence-parallel over " + std::to_string(comm.size()) + " ranks").c_str() : "");
    std::printf("%-10s %12s %12s %10s\n", "backend", "median ms", "min ms", "GFLOP/s");
  }
  for (const auto& name : names) {
    std::unique_ptr<backend::Backend> be;
    try {
      be = make_backend(comm, name);
    } catch (const BackendError& e) {
      if (lead) std::printf("%-10s unavailable: %s\n", name.c_str(), e.what());
      continue;
    }
    auto exe = be->compile(p.graph);
    exe->set_profiling(profile);
    exe->run(p.inputs);
    const ir::Graph& g = exe->graph();
    auto shapes = shapes_as_run(g, p.inputs);
    double flops = 0;
    for (std::size_t i = 0; i < g.size(); ++i) flops += ir::estimated_flops(g, static_cast<ir::ValueId>(i), shapes);
    std::vector<double> ms;
    std::vector<std::vector<backend::KernelTime>> profiles;
    Progress progress("bench " + name + ": run", repeat);
    for (int i = 0; i < repeat; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      exe->run(p.inputs);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (profile) profiles.push_back(exe->profile());
      if (lead) progress.update(i + 1);
    }
    progress.clear();
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    if (!lead) continue;
    std::printf("%-10s %12.4f %12.4f %10.2f\n", name.c_str(), median, ms.front(), flops / (median * 1e-3) / 1e9);
    if (profile) print_profile(*be, g, profiles);
  }
  return 0;
}

}  // namespace qkv::tool
