// qkv fuzz: random graphs from the op registry, forward and backward on every backend against the
// float64 reference; a failure is shrunk to its smallest failing graph and written as a repro.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "io/file.hpp"
#include "io/npy.hpp"
#include "ir/printer.hpp"
#include "sweeps/random_graph.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"

namespace qkv::tool {

int cmd_fuzz(const FuzzFlags& f, const std::vector<std::string>& backends) {
  if (f.graphs < 1 || f.ops < 1) throw UsageError("--graphs and --ops must be at least 1");
  if (!f.dump_dir.empty()) io::check_writable_dir(f.dump_dir);
  const auto t0 = std::chrono::steady_clock::now();
  int failed = 0, backward = 0;
  Progress progress("fuzz: graph", f.graphs);
  for (int i = 0; i < f.graphs; ++i) {
    const std::uint64_t seed = f.seed + static_cast<std::uint64_t>(i);
    const auto rg = backend::random_graph(seed, f.ops);
    const auto result = backend::check_random_graph(rg, backends, f.grad, f.budget_factor);
    backward += result.backward_checked;
    progress.update(i + 1);
    if (result.pass) continue;
    progress.clear();
    ++failed;
    std::printf("graph seed %llu FAILED: %s\n", static_cast<unsigned long long>(seed), result.failure.c_str());
    const std::string failing_backend =
        result.failure.substr(result.failure.find(" on ") + 4, result.failure.find(':') - result.failure.find(" on ") - 4);
    const ir::Graph small = backend::shrink_failure(result.failing_graph, result.failing_inputs, failing_backend, f.budget_factor);
    std::printf("smallest failing graph (%zu of %zu nodes):\n%s", small.size(), result.failing_graph.size(), ir::print(small).c_str());
    if (f.dump_dir.empty()) {
      std::printf("(--dump-dir DIR writes it with its inputs and the command that reproduces it)\n");
    } else {
      const std::string dir = (std::filesystem::path(f.dump_dir) / ("seed" + std::to_string(seed))).string();
      io::make_dirs(dir);
      io::OutputBatch files;
      std::string cmd = "qkv check " + dir + "/graph.qkv --backend reference," + failing_backend;
      files.add(dir + "/graph.qkv", ir::print(small));
      for (ir::ValueId v : small.inputs()) {
        const std::string& name = small.node(v).name;
        files.add(dir + "/" + name + ".npy", io::format_npy(result.failing_inputs.at(name)));
        cmd += " --in " + name + "=" + dir + "/" + name + ".npy";
      }
      files.commit();
      std::printf("wrote %s; reproduce with:\n  %s\n", dir.c_str(), cmd.c_str());
    }
    if (failed >= f.max_failures) break;
  }
  progress.clear();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%d random graphs (seeds %llu..), %d with a backward graph, on", f.graphs, static_cast<unsigned long long>(f.seed), backward);
  for (const auto& b : backends) std::printf(" %s", b.c_str());
  std::printf(": %d failed, %.1f s\n", failed, s);
  return failed ? 1 : 0;
}

}  // namespace qkv::tool
