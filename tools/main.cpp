// The qkv program: run, check and inspect attention models on any backend.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include "backends/backend.hpp"
#include "backends/equivalence.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "codegen/glsl.hpp"
#include "io/npy.hpp"
#include "ir/op_cases.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "tools/models/models.hpp"

namespace {

using qkv::Tensor;
using qkv::backend::TensorMap;

/// Bad usage or input: exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

/// name=value pairs from repeated options.
std::map<std::string, std::string> pairs(const std::vector<std::string>& items, const char* option) {
  std::map<std::string, std::string> r;
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError(std::string(option) + " expects NAME=FILE, got '" + item + "'");
    r[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return r;
}

/// The attention inputs as the sdpa model takes them: batch dims flattened into B.
struct SdpaInputs {
  TensorMap tensors;
  std::vector<std::int64_t> batch;  // the original batch dims
  std::int64_t n = 0, m = 0, d = 0, dv = 0;
};

SdpaInputs prepare_sdpa(const std::map<std::string, std::string>& files, bool& has_mask) {
  for (const auto& [name, file] : files)
    if (name != "q" && name != "k" && name != "v" && name != "mask" && name != "dout")
      throw UsageError("sdpa has no input '" + name + "' (inputs: q, k, v, mask, and dout with --grad)");
  for (const char* need : {"q", "k", "v"})
    if (!files.contains(need)) throw UsageError(std::string("missing --in ") + need + "=FILE.npy");
  std::map<std::string, Tensor> t;
  for (const auto& [name, file] : files) {
    Tensor x = qkv::io::read_npy(file);
    if (name == "mask") {
      if (x.dtype() != qkv::DType::boolean)
        throw UsageError(file + ": mask must be a bool array (true keeps a key), got " + std::string(qkv::dtype_name(x.dtype())));
    } else {
      if (x.dtype() == qkv::DType::boolean) throw UsageError(file + ": tensor '" + name + "' must be float32 or float64, got bool");
      x = x.to(qkv::DType::f32);
    }
    if (x.rank() < 2) throw UsageError(file + ": tensor '" + name + "' must have shape (..., N, D), got " + shape_string(x.shape()));
    t.emplace(name, std::move(x));
  }
  const auto &q = t.at("q"), &k = t.at("k"), &v = t.at("v");
  SdpaInputs r;
  r.batch.assign(q.shape().begin(), q.shape().end() - 2);
  auto batch_of = [](const Tensor& x) { return std::vector<std::int64_t>(x.shape().begin(), x.shape().end() - 2); };
  for (const auto* name : {"k", "v"})
    if (batch_of(t.at(name)) != r.batch)
      throw UsageError(files.at(name) + ": tensor '" + name + "' has batch dims " + shape_string(batch_of(t.at(name))) +
                       ", q has " + shape_string(r.batch));
  r.n = q.shape().end()[-2];
  r.d = q.shape().back();
  r.m = k.shape().end()[-2];
  r.dv = v.shape().back();
  if (k.shape().back() != r.d)
    throw UsageError(files.at("k") + ": tensor 'k' has head dim " + std::to_string(k.shape().back()) + ", q has " + std::to_string(r.d));
  if (v.shape().end()[-2] != r.m)
    throw UsageError(files.at("v") + ": tensor 'v' has " + std::to_string(v.shape().end()[-2]) + " keys, k has " + std::to_string(r.m));
  std::int64_t b = 1;
  for (auto x : r.batch) b *= x;
  r.tensors.emplace("q", q.reshaped({b, r.n, r.d}));
  r.tensors.emplace("k", k.reshaped({b, r.m, r.d}));
  r.tensors.emplace("v", v.reshaped({b, r.m, r.dv}));
  if (t.contains("dout")) {
    const Tensor& dout = t.at("dout");
    std::vector<std::int64_t> want = r.batch;
    want.push_back(r.n);
    want.push_back(r.dv);
    if (dout.shape() != want)
      throw UsageError(files.at("dout") + ": tensor 'dout' (the gradient of out) has shape " + shape_string(dout.shape()) + ", out has " +
                       shape_string(want));
    r.tensors.emplace("dout", dout.reshaped({b, r.n, r.dv}));
  }
  has_mask = t.contains("mask");
  if (has_mask) {
    // Broadcast the mask (..., N, M) over the batch dims on the host.
    const Tensor& mask = t.at("mask");
    const auto& ms = mask.shape();
    if (ms.end()[-2] != r.n && ms.end()[-2] != 1) throw UsageError(files.at("mask") + ": mask " + shape_string(ms) + " does not broadcast to (..., " + std::to_string(r.n) + ", " + std::to_string(r.m) + ")");
    if (ms.back() != r.m && ms.back() != 1) throw UsageError(files.at("mask") + ": mask " + shape_string(ms) + " does not broadcast to (..., " + std::to_string(r.n) + ", " + std::to_string(r.m) + ")");
    std::vector<std::int64_t> full = r.batch;
    full.push_back(r.n);
    full.push_back(r.m);
    if (ms.size() > full.size()) throw UsageError(files.at("mask") + ": mask " + shape_string(ms) + " has more dims than the scores " + shape_string(full));
    std::size_t off = full.size() - ms.size();
    for (std::size_t i = 0; i < ms.size(); ++i)
      if (ms[i] != 1 && ms[i] != full[off + i])
        throw UsageError(files.at("mask") + ": mask " + shape_string(ms) + " does not broadcast to " + shape_string(full));
    Tensor out(qkv::DType::boolean, {b, r.n, r.m});
    std::vector<std::int64_t> idx(full.size(), 0);
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      std::int64_t src = 0;
      for (std::size_t j = 0; j < ms.size(); ++j) src = src * ms[j] + (ms[j] == 1 ? 0 : idx[off + j]);
      out.data<std::uint8_t>()[i] = mask.data<std::uint8_t>()[src];
      for (std::size_t j = full.size(); j-- > 0;) {
        if (++idx[j] < full[j]) break;
        idx[j] = 0;
      }
    }
    r.tensors.emplace("mask", std::move(out));
  }
  return r;
}

/// Prints a result whose matrices are small enough to read (at most 16 x 16 per batch entry).
void print_small(const char* name, const Tensor& t) {
  const std::int64_t rows = t.shape().end()[-2], cols = t.shape().back(), batches = t.numel() / std::max<std::int64_t>(rows * cols, 1);
  if (rows > 16 || cols > 16 || batches > 4) return;
  std::printf("%s:\n", name);
  for (std::int64_t b = 0; b < batches; ++b) {
    for (std::int64_t i = 0; i < rows; ++i) {
      std::printf("  ");
      for (std::int64_t j = 0; j < cols; ++j) std::printf(" %8.4f", t.at((b * rows + i) * cols + j));
      std::printf("\n");
    }
    if (b + 1 < batches) std::printf("\n");
  }
}

/// The op x backend support table, from the registry and each backend's support predicate (no
/// device needed).
int cmd_ops() {
  const auto backends = qkv::backend::backend_names();
  std::printf("| op | inputs |");
  for (const auto& name : backends) std::printf(" %s |", name.c_str());
  std::printf(" gradient | meaning |\n|---|---|");
  for (std::size_t i = 0; i < backends.size(); ++i) std::printf("---|");
  std::printf("---|---|\n");
  for (qkv::ir::Op op : qkv::ir::all_ops()) {
    const auto& info = qkv::ir::op_info(op);
    qkv::ir::Graph g = qkv::ir::case_graph(op, qkv::ir::op_cases(op).at(0));
    const qkv::ir::Node& node = g.node(g.output("out"));
    std::printf("| `%s` | %d |", std::string(info.name).c_str(), info.arity);
    for (const auto& name : backends) std::printf(" %s |", qkv::backend::backend_supports(name, node) ? "kernel" : "decomposed");
    const auto grad = qkv::ir::gradient_info(op);
    const char* kind = grad.kind == qkv::ir::GradKind::rule        ? "rule"
                       : grad.kind == qkv::ir::GradKind::zero      ? "none"
                       : grad.kind == qkv::ir::GradKind::decompose ? "via decomposition"
                                                                   : "MISSING";
    std::printf(" %s%s%s | %s |\n", kind, grad.why.empty() ? "" : ": ", std::string(grad.why).c_str(), std::string(info.doc).c_str());
  }
  return 0;
}

int cmd_devices() {
  for (const auto& s : qkv::backend::probe_backends())
    std::printf("%-10s %-11s %s\n", s.name.c_str(), s.available ? "available" : "unavailable", s.detail.c_str());
  try {
    auto devices = qkv::backend::vulkan_devices();
    for (std::size_t i = 0; i < devices.size(); ++i) std::printf("  vulkan device %zu: %s\n", i, devices[i].c_str());
  } catch (const qkv::Error&) {
  }
  return 0;
}

struct ModelFlags {
  std::string model;
  bool causal = false;
  bool mask = false;
  std::optional<double> scale;
};

void add_model_flags(CLI::App* app, ModelFlags& f) {
  app->add_option("model", f.model, "the model (sdpa)")->required()->check(CLI::IsMember(qkv::models::model_names()));
  app->add_flag("--causal", f.causal, "mask future keys (top-left aligned)");
  app->add_option("--scale", f.scale, "score scale (default 1/sqrt(D))");
}

/// The sdpa graph, or with `grad` its backward: out seeded from input "dout", outputs d_q, d_k, d_v.
qkv::ir::Graph sdpa_graph(const qkv::models::SdpaOptions& o, bool grad) {
  qkv::ir::Graph g = qkv::models::sdpa(o);
  return grad ? qkv::ir::build_backward(g, {"", {"q", "k", "v"}, {"out"}}) : g;
}

int cmd_run(const ModelFlags& f, const std::string& backend_name, const std::vector<std::string>& ins, const std::vector<std::string>& outs,
            bool grad) {
  bool has_mask = false;
  SdpaInputs in = prepare_sdpa(pairs(ins, "--in"), has_mask);
  if (grad != in.tensors.contains("dout"))
    throw UsageError(grad ? "--grad needs --in dout=FILE.npy (the gradient of out)" : "--in dout is only for --grad");
  auto out_files = pairs(outs, "--out");
  const std::vector<std::string> known = grad ? std::vector<std::string>{"out", "weights", "d_q", "d_k", "d_v"}
                                              : std::vector<std::string>{"out", "weights"};
  for (const auto& [name, file] : out_files)
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw UsageError("sdpa has no output '" + name + "' (outputs: out, weights" + (grad ? ", d_q, d_k, d_v)" : "; d_q, d_k, d_v with --grad)"));
  double scale = f.scale.value_or(1.0 / std::sqrt(static_cast<double>(in.d)));
  qkv::ir::Graph g = sdpa_graph({f.causal, has_mask, scale}, grad);
  auto backend = qkv::backend::create(backend_name);
  auto exe = backend->compile(g);
  auto t0 = std::chrono::steady_clock::now();
  TensorMap r = exe->run(in.tensors);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("sdpa on %s (%s): q %s, k %s, v %s%s, %.3f ms\n", backend->name().c_str(), backend->device().c_str(),
              shape_string(in.tensors.at("q").shape()).c_str(), shape_string(in.tensors.at("k").shape()).c_str(),
              shape_string(in.tensors.at("v").shape()).c_str(), f.causal ? ", causal" : "", ms);
  for (const auto& [name, file] : out_files) {
    std::vector<std::int64_t> shape = in.batch;
    const std::int64_t rows = name == "d_k" || name == "d_v" ? in.m : in.n;
    const std::int64_t cols = name == "out" || name == "d_v" ? in.dv : name == "weights" ? in.m : in.d;
    shape.push_back(rows);
    shape.push_back(cols);
    Tensor t = r.at(name).reshaped(shape);
    qkv::io::write_npy(file, t);
    std::printf("  %s %s -> %s\n", name.c_str(), shape_string(shape).c_str(), file.c_str());
  }
  if (out_files.empty()) std::printf("  (no --out given; outputs not written)\n");
  for (const auto& [name, t] : r) print_small(name.c_str(), t);
  return 0;
}

int cmd_check(const ModelFlags& f, const std::string& backends, std::uint64_t seed, bool with_mask, bool grad) {
  std::vector<std::string> names;
  std::stringstream ss(backends);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) names.push_back(item);
  if (names.empty()) throw UsageError("--backends lists no backend");
  const std::int64_t d = 16;
  qkv::ir::Graph g = sdpa_graph({f.causal, with_mask, f.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)))}, grad);
  auto inputs = qkv::backend::random_inputs(g, {{"B", 3}, {"N", 17}, {"M", 23}, {"D", d}, {"Dv", 12}}, seed);
  if (with_mask)
    for (std::int64_t r = 0; r < 3 * 17; ++r) inputs.at("mask").data<std::uint8_t>()[r * 23] = 1;
  auto report = qkv::backend::check_equivalence(g, inputs, names);
  std::printf("sdpa%s%s%s, B=3 N=17 M=23 D=16 Dv=12, seed %llu, against the float64 reference:\n", grad ? " backward" : "",
              f.causal ? " causal" : "", with_mask ? " masked" : "", static_cast<unsigned long long>(seed));
  std::fputs(report.table().c_str(), stdout);
  std::printf("%s\n", report.pass() ? "all backends within budget" : "FAILED: a backend is outside its budget or did not run");
  return report.pass() ? 0 : 1;
}

int cmd_dump(const ModelFlags& f, bool ir, bool dot, bool glsl, bool backward, const std::string& backend_name) {
  qkv::ir::Graph g = sdpa_graph({f.causal, f.mask, f.scale.value_or(0.125)}, backward);
  if (dot) std::fputs(qkv::ir::to_dot(g).c_str(), stdout);
  if (glsl) {
    auto backend = qkv::backend::create(backend_name.empty() ? "vulkan" : backend_name);
    std::fputs(qkv::codegen::emit_glsl(backend->compile(g)->graph()).c_str(), stdout);
  }
  if (ir || (!dot && !glsl)) std::fputs(qkv::ir::print(g).c_str(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qkv: attention models written in C++, lowered to an IR, run on reference, cpu and vulkan backends"};
  app.set_version_flag("--version", std::string("qkv ") + QKV_VERSION);
  app.require_subcommand(1);

  app.add_subcommand("devices", "list backends, their devices, and why one is unavailable");
  app.add_subcommand("ops", "the op x backend support table, generated from the op registry");

  ModelFlags run_flags;
  std::string backend = qkv::backend::default_backend_name();
  std::vector<std::string> ins, outs;
  bool run_grad = false;
  auto* run = app.add_subcommand("run", "run a model on .npy inputs and write .npy outputs");
  run->add_flag("--grad", run_grad, "also run the backward graph: --in dout=FILE.npy, outputs d_q, d_k, d_v");
  add_model_flags(run, run_flags);
  run->add_option("--backend", backend, "reference, cpu or vulkan (default: $QKV_BACKEND or cpu)");
  run->add_option("--in", ins, "an input: NAME=FILE.npy (q, k, v: float, shape (..., N, D); mask: bool (..., N, M), true keeps)");
  run->add_option("--out", outs, "an output: NAME=FILE.npy (out, weights)");

  ModelFlags check_flags;
  std::string backends = "reference,cpu,vulkan";
  std::uint64_t seed = 1;
  bool check_mask = false;
  auto* check = app.add_subcommand("check", "run a model on random inputs on each backend and compare with the float64 reference");
  add_model_flags(check, check_flags);
  check->add_option("--backends", backends, "comma-separated backends")->capture_default_str();
  check->add_option("--seed", seed, "random seed")->capture_default_str();
  check->add_flag("--mask", check_mask, "add a random boolean mask input");
  bool check_grad = false;
  check->add_flag("--grad", check_grad, "check the backward graph (d_q, d_k, d_v from a random dout) too");

  ModelFlags dump_flags;
  bool ir = false, dot = false, glsl = false;
  std::string dump_backend;
  auto* dump = app.add_subcommand("dump", "print a model's IR, Graphviz drawing or generated shaders");
  add_model_flags(dump, dump_flags);
  dump->add_flag("--mask", dump_flags.mask, "with a boolean mask input");
  dump->add_flag("--ir", ir, "the lowered IR (default)");
  dump->add_flag("--dot", dot, "a Graphviz DOT drawing");
  dump->add_flag("--glsl", glsl, "the GLSL compute shaders the vulkan backend generates");
  bool dump_backward = false;
  dump->add_flag("--backward", dump_backward, "the backward graph (input dout; outputs d_q, d_k, d_v) instead of the forward");
  dump->add_option("--backend", dump_backend, "backend whose lowering --glsl shows (default vulkan)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "qkv: %s\n", e.what());
    return 2;
  }
  try {
    if (app.got_subcommand("devices")) return cmd_devices();
    if (app.got_subcommand("ops")) return cmd_ops();
    if (run->parsed()) return cmd_run(run_flags, backend, ins, outs, run_grad);
    if (check->parsed()) return cmd_check(check_flags, backends, seed, check_mask, check_grad);
    if (dump->parsed()) return cmd_dump(dump_flags, ir, dot, glsl, dump_backward, dump_backend);
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
