// The Backend interface and the registry that creates backends by name at run time.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.hpp"
#include "ir/storage_plan.hpp"
#include "ir/tensor.hpp"

namespace qkv::backend {

/// Tensors by name: a graph's inputs or outputs.
using TensorMap = std::map<std::string, Tensor, std::less<>>;

/// One kernel's share of a run, measured on the device.
struct KernelTime {
  ir::ValueId value;  ///< the node of Executable::graph() the kernel computes
  double seconds;     ///< from the end of the previous kernel (or of the uploads) to its own end
};

/// How many of attention's scores one fused kernel computed and how many it skipped in whole
/// masked tiles (block sparsity: causality, a sliding window, a modifier that drops whole tiles).
/// Counted in scores, not tiles: a tile cut short at the diagonal counts what it computed.
struct TileCount {
  ir::ValueId value;      ///< the fused node of Executable::graph()
  std::int64_t computed;  ///< scores in the tiles computed
  std::int64_t skipped;   ///< scores left out in tiles (or, on the cpu, slices of a tile) all masked
  std::int64_t unmasked;  ///< of the computed, scores in tiles their masks keep whole, run without evaluating them (cpu)
  /// skipped / (computed + skipped): the share of the scores left out (0 when there were none).
  double skipped_fraction() const { return computed + skipped == 0 ? 0.0 : static_cast<double>(skipped) / static_cast<double>(computed + skipped); }
};

/// What a run tells its caller while it computes (Executable::run_observed): each output
/// as soon as its value is final, and a call between kernels where the caller moves its own work
/// along, such as MPI transfers of outputs reported earlier. Both are called on the thread that
/// called run.
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  /// Output `name` is final; `value` is what run returns for it (valid during the call).
  virtual void output_ready(std::string_view name, const Tensor& value) = 0;
  /// Between two kernels of the run.
  virtual void between_kernels() {}
};

/// A graph compiled for one backend. Runs reuse what the first run with the same input shapes
/// planned (buffers, kernels, command buffers).
class Executable {
 public:
  virtual ~Executable() = default;
  /// Runs on one tensor per graph input and returns every graph output. Throws ShapeError when
  /// the inputs do not fit the graph; nothing is written to the inputs.
  virtual TensorMap run(const TensorMap& inputs) = 0;
  /// The same run, writing each output into `outputs` (not the map of `inputs`); entries of
  /// other names stay as they are. On cpu and vulkan an output already there with the graph's
  /// dtype and this run's shape is overwritten where it lies (its storage reused), any other is
  /// replaced: a loop passing the same map every step (a decode loop) allocates nothing for its
  /// outputs after the first, and on the cpu a planned small graph's run allocates nothing at
  /// all. This default (the reference, sequence parallelism) and outputs the backend computes in
  /// another dtype than declared (a half graph's f32 lowering) replace them.
  virtual void run_into(const TensorMap& inputs, TensorMap& outputs) {
    for (auto& [name, t] : run(inputs)) outputs.insert_or_assign(name, std::move(t));
  }
  /// The same run, reporting to `observer` each output as soon as its value is final and calling
  /// it between kernels. Backends that run kernel by kernel on the host (reference, cpu) report
  /// outputs during the run; the others report them all when it ends (this default).
  virtual TensorMap run_observed(const TensorMap& inputs, RunObserver& observer) {
    TensorMap out = run(inputs);
    for (const auto& [name, t] : out) observer.output_ready(name, t);
    return out;
  }
  /// The graph as the backend runs it, after its lowering passes.
  virtual const ir::Graph& graph() const = 0;
  /// Holds `tensors` on the backend as the values of the inputs they name, for every later run
  /// until set again: runs no longer pass them, and the graph's updates write back into them,
  /// so parameters and optimizer state stay on the device between training steps. Replaces
  /// whatever was held before. Taken by value: a caller that moves its tensors in (a generator's
  /// cache) leaves no second copy.
  virtual void set_state(TensorMap tensors) = 0;
  /// The held inputs' current values, after every update so far (copied to the host).
  virtual TensorMap state() = 0;
  /// Bytes of intermediate and output storage the last run planned (0 before the first run);
  /// inputs the backend reads in place are not counted.
  virtual std::int64_t planned_bytes() const = 0;
  /// Turns per-kernel device timing on or off for later runs (off by default). Backends that
  /// cannot time their kernels ignore it.
  virtual void set_profiling(bool /*on*/) {}
  /// The last run's kernels in launch order with their device times, when profiling was on and
  /// the device can time them (vulkan with timestamp queries); otherwise empty. Uploads and
  /// downloads are not included: the sum is the time the device spent computing.
  virtual std::vector<KernelTime> profile() const { return {}; }
  /// The last run's tile counts of its fused attention kernels, in launch order, for backends
  /// that count them (cpu); otherwise empty. A kernel computing several nodes counts once, under
  /// the first.
  virtual std::vector<TileCount> tile_counts() const { return {}; }
};

/// A backend: compiles graphs into executables for its device. Made by create(name); what it
/// does not run itself (supports) is decomposed before it compiles.
class Backend {
 public:
  virtual ~Backend() = default;
  /// "reference", "cpu" or "vulkan".
  virtual std::string name() const = 0;
  /// The device it runs on, in words.
  virtual std::string device() const = 0;
  /// Whether the backend runs this node directly; composites it does not support are decomposed
  /// into primitives by its compile (explicitly, as their reference meaning).
  virtual bool supports(const ir::Node& n) const = 0;
  /// Lowers and compiles a graph. Throws UnsupportedError naming the op it cannot run.
  virtual std::unique_ptr<Executable> compile(const ir::Graph& g) = 0;
  /// The kernel that computes node `v` of a graph this backend lowered (Executable::graph()), in
  /// words: what `qkv explain` shows.
  virtual std::string kernel_name(const ir::Graph& lowered, ir::ValueId v) const = 0;
  /// What its kernels guarantee of their bits (docs/backends.md, "Determinism"), in words: what
  /// `qkv explain` prints. Every kernel of qkv's backends is deterministic; where the contract
  /// stops (across devices, dropout's masks, packed batches) is said here.
  virtual std::string determinism() const = 0;
  /// How node `v`'s kernel divides its work at these shapes (`shapes` of `lowered`'s values), in
  /// words, where that depends on the shapes (split-KV decoding); empty where there is nothing
  /// to say. What `qkv explain` adds under the kernel.
  virtual std::string work_split(const ir::Graph& lowered, ir::ValueId v, const std::vector<ir::Shape>& shapes) const {
    (void)lowered, (void)v, (void)shapes;
    return {};
  }
  /// The storage plan of a graph this backend lowered: per value, the dtype its storage holds and
  /// whether it is a view or written in place by another value's kernel, as the executable
  /// plans it (what `qkv explain` counts bytes by and `qkv dump --storage` prints). The default,
  /// the reference's, is ir::plain_storage_plan: every value but a reshape its own (the reference
  /// holds them in float64; the plan counts them in their dtypes).
  virtual ir::StoragePlan storage_plan(const ir::Graph& lowered) const { return ir::plain_storage_plan(lowered); }
  /// The values the kernel computing node `v` reads from memory: its inputs, unless the backend
  /// fuses nodes (then a fused kernel's operands, and nothing for a node computed inside another
  /// node's kernel). What `qkv explain` counts as bytes moved.
  virtual std::vector<ir::ValueId> kernel_reads(const ir::Graph& lowered, ir::ValueId v) const { return lowered.node(v).inputs; }
};

/// The backends qkv knows, in order: reference, cpu, vulkan.
std::vector<std::string> backend_names();

/// Whether the named backend runs `n` itself (true) or as its decomposition, decided by the
/// backend's code without starting it (no device needed). Throws UnsupportedError for an unknown
/// name.
bool backend_supports(std::string_view name, const ir::Node& n);

/// Creates a backend by name. Throws UnsupportedError for an unknown name, BackendError when it
/// cannot start (no Vulkan loader or device); never substitutes another backend.
std::unique_ptr<Backend> create(std::string_view name);

/// Whether a backend can start here, as `qkv devices` reports it.
struct BackendStatus {
  std::string name;        ///< reference, cpu or vulkan
  bool available = false;  ///< whether create(name) succeeds
  std::string detail;      ///< the device when available, otherwise why not
};
/// Tries to start each backend and reports what it found.
std::vector<BackendStatus> probe_backends();

/// The backend named by QKV_BACKEND, or "cpu".
std::string default_backend_name();

}  // namespace qkv::backend
