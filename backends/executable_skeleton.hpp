// The run every executable shares, as a base class: a backend supplies how it plans for a set of
// input shapes, how it computes, and where an output's values are.
#pragma once

#include <cstring>
#include <string_view>
#include <vector>

#include "backends/backend.hpp"
#include "backends/run_inputs.hpp"
#include "ir/bind.hpp"

namespace qkv::backend {

/// An Executable's run: the call's tensors gathered with the held state (no copies), their
/// values checked, a new plan only when their shapes differ from the last plan's, the backend's
/// computation, and the outputs as tensors. The graph, the held state and the bound shapes live
/// here; set_state and state stay the backend's (a device may keep the state elsewhere).
class ExecutableSkeleton : public Executable {
 public:
  TensorMap run(const TensorMap& inputs) override {
    prepare(inputs);
    compute();
    TensorMap out;
    for (const auto& [name, v] : graph_.outputs()) out.emplace(name, output(name, v));
    return out;
  }
  void run_into(const TensorMap& inputs, TensorMap& outputs) override {
    prepare(inputs);
    compute();
    for (const auto& [name, v] : graph_.outputs()) {
      auto at = outputs.find(name);
      if (at == outputs.end()) outputs.emplace(name, output(name, v));
      else output_into(name, v, at->second);
    }
  }
  TensorMap run_observed(const TensorMap& inputs, RunObserver& observer) override {
    prepare(inputs);
    observer_ = &observer;
    reported_.clear();
    struct Detach {
      RunObserver*& o;
      ~Detach() { o = nullptr; }
    } detach{observer_};
    compute();
    // What compute did not report (all of it, for a backend that does not call computed()).
    for (const auto& [name, v] : graph_.outputs())
      if (!reported_.contains(name)) observer.output_ready(name, reported_.emplace(name, output(name, v)).first->second);
    return std::move(reported_);
  }
  const ir::Graph& graph() const override { return graph_; }

 protected:
  explicit ExecutableSkeleton(ir::Graph g) : graph_(std::move(g)), input_ids_(graph_.inputs()) {}

  /// Plans for the shapes of tensors_ (bind_shapes() binds them into shapes_); throws what
  /// binding throws, or ResourceError when the plan does not fit.
  virtual void plan() = 0;
  /// Computes every output and writes the graph's updates back into the held state.
  virtual void compute() = 0;
  /// Output `name`, value `v`, of the last computation.
  virtual Tensor output(std::string_view name, ir::ValueId v) = 0;
  /// The same output into `dst`: where it lies when `dst` has its dtype and shape (reusable),
  /// otherwise replaced. Backends that copy their outputs from host memory override it.
  virtual void output_into(std::string_view name, ir::ValueId v, Tensor& dst) { dst = output(name, v); }

  /// Called by compute() once node `v`'s value is final (kernel by kernel, in order; never for
  /// graph inputs): reports the outputs that are `v` to the observer of run_observed, if any,
  /// then lets it do its own work between kernels. Outputs live to the end of a run, so no later
  /// kernel overwrites a value once reported.
  void computed(ir::ValueId v) {
    if (!observer_) return;
    if (graph_.node(v).op != ir::Op::input)
      for (const auto& [name, out] : graph_.outputs())
        if (out == v && !reported_.contains(name)) observer_->output_ready(name, reported_.emplace(name, output(name, v)).first->second);
    observer_->between_kernels();
  }

  /// shapes_ for this run's tensors (read in place: no input is copied to bind them).
  void bind_shapes(bool f64_for_f32 = false) { shapes_ = ir::bind_shapes(graph_, tensors_, f64_for_f32); }
  /// Whether `t` can take output `v` of this run where it lies: the graph's dtype and the planned
  /// shape (compared in place: no allocation).
  bool reusable(const Tensor& t, ir::ValueId v) const {
    const ir::Shape& s = shapes_[static_cast<std::size_t>(v)];
    if (t.dtype() != graph_.node(v).dtype || t.rank() != s.rank) return false;
    for (int d = 0; d < s.rank; ++d)
      if (t.shape()[static_cast<std::size_t>(d)] != s[d]) return false;
    return true;
  }
  /// Output `v` from values held at `src` in `held`: f32 values as the graph types v (f32, or
  /// bool from 0 and 1), or f16 or bf16 in 16 bits, which come out as the graph declares v (as
  /// they are, or widened: an f32 graph's round_f16).
  Tensor held_output(ir::ValueId v, const void* src, DType held) const {
    Tensor t = Tensor::uninitialized(is_half(held) ? held : graph_.node(v).dtype, ir::to_vector(shapes_[static_cast<std::size_t>(v)]));
    write_held(src, t);  // in full
    if (t.dtype() != graph_.node(v).dtype) return t.to(graph_.node(v).dtype);
    return t;  // moved, not copied (as one arm of a conditional it was copied)
  }
  /// held_output into `dst`: written where it lies when reusable and of the held values' own
  /// kind, otherwise replaced by held_output's tensor.
  void held_output_into(ir::ValueId v, const void* src, DType held, Tensor& dst) const {
    if (!reusable(dst, v) || (is_half(held) && held != dst.dtype())) dst = held_output(v, src, held);
    else write_held(src, dst);
  }

  ir::Graph graph_;
  std::vector<ir::ValueId> input_ids_;  // the graph's inputs, in order
  InputValueChecks value_checks_{graph_, input_ids_};
  std::vector<const Tensor*> tensors_;  // this run's input tensors, in input order (capacity reused)
  TensorMap state_;                     // the held inputs
  InputSignature signature_;            // the input shapes the plan was made for
  std::vector<ir::Shape> shapes_;       // every node's shape, as planned

 private:
  /// t's elements from the values at `src`: bool from f32 0 and 1, anything else the same bytes
  /// (f32 from f32, 16 bits from 16 bits).
  static void write_held(const void* src, Tensor& t) {
    if (t.dtype() == DType::boolean) {
      const auto* f = static_cast<const float*>(src);
      std::uint8_t* out = t.data<std::uint8_t>();
      for (std::int64_t j = 0; j < t.numel(); ++j) out[j] = f[j] != 0.0f;
    } else if (t.nbytes()) {
      std::memcpy(t.raw(), src, t.nbytes());
    }
  }

  /// The run's tensors gathered and checked, and a plan for their shapes.
  void prepare(const TensorMap& inputs) {
    gather_inputs(graph_, input_ids_, inputs, state_, tensors_);
    value_checks_.check(tensors_);
    if (!signature_.matches(tensors_)) {
      // A plan that throws (a ResourceError for shapes that do not fit) may have released the
      // last one: until one succeeds, every run plans again, the last shapes' too.
      signature_.invalidate();
      plan();
      signature_.record(tensors_);
    }
  }

  RunObserver* observer_ = nullptr;  // during run_observed
  TensorMap reported_;               // the outputs reported so far in run_observed
};

}  // namespace qkv::backend
