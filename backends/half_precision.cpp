// The executable around a half-precision graph's f32 lowering: dtypes at its boundary.
#include "backends/half_precision.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "ir/half.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::backend {

namespace {

class HalfPrecisionExecutable final : public Executable {
 public:
  HalfPrecisionExecutable(const ir::Graph& g, std::unique_ptr<Executable> inner, ParallelFor parallel)
      : inner_(std::move(inner)), parallel_(std::move(parallel)) {
    // Half inputs the lowering kept (a backend that reads them in 16 bits) pass as they are.
    std::set<std::string, std::less<>> kept;
    for (ir::ValueId v : inner_->graph().inputs())
      if (is_half(inner_->graph().node(v).dtype)) kept.insert(inner_->graph().node(v).name);
    for (ir::ValueId v : g.inputs())
      if (is_half(g.node(v).dtype) && !kept.contains(g.node(v).name)) inputs_.emplace(g.node(v).name, std::pair{g.node(v).dtype, g.type_string(v)});
    for (const auto& [name, v] : g.outputs()) outputs_.emplace(name, g.node(v).dtype);
  }

  TensorMap run(const TensorMap& inputs) override {
    if (inputs_.empty()) return narrow(inner_->run(inputs));  // none to widen: no copies (tensors own their bytes)
    return narrow(inner_->run(widen(inputs)));
  }
  void run_into(const TensorMap& inputs, TensorMap& outputs) override {
    if (inputs_.empty()) inner_->run_into(inputs, outputs);
    else inner_->run_into(widen(inputs), outputs);
    // An output the inner run gives in another dtype than declared comes out converted (a new
    // tensor); the others stay where the inner run wrote them.
    for (const auto& [name, dtype] : outputs_)
      if (auto it = outputs.find(name); it != outputs.end() && converts(it->second.dtype(), dtype))
        it->second = convert(it->second, dtype, parallel_);
  }
  TensorMap run_observed(const TensorMap& inputs, RunObserver& observer) override {
    struct Narrowing final : RunObserver {
      const HalfPrecisionExecutable& exe;
      RunObserver& to;
      Narrowing(const HalfPrecisionExecutable& e, RunObserver& o) : exe(e), to(o) {}
      void output_ready(std::string_view name, const Tensor& value) override {
        const auto it = exe.outputs_.find(name);
        if (it == exe.outputs_.end() || !exe.converts(value.dtype(), it->second)) to.output_ready(name, value);
        else to.output_ready(name, convert(value, it->second, exe.parallel_));
      }
      void between_kernels() override { to.between_kernels(); }
    } narrowing(*this, observer);
    if (inputs_.empty()) return narrow(inner_->run_observed(inputs, narrowing));
    return narrow(inner_->run_observed(widen(inputs), narrowing));
  }
  const ir::Graph& graph() const override { return inner_->graph(); }
  void set_state(TensorMap tensors) override { inner_->set_state(inputs_.empty() ? std::move(tensors) : widen(tensors)); }
  TensorMap state() override {
    TensorMap s = inner_->state();
    for (auto& [name, t] : s)
      if (auto it = inputs_.find(name); it != inputs_.end()) t = convert(t, it->second.first, parallel_);
    return s;
  }
  std::int64_t planned_bytes() const override { return inner_->planned_bytes(); }
  void set_profiling(bool on) override { inner_->set_profiling(on); }
  std::vector<KernelTime> profile() const override { return inner_->profile(); }
  std::vector<TileCount> tile_counts() const override { return inner_->tile_counts(); }

 private:
  /// The tensors for the f32 lowering: half inputs widened (exactly), checked to be of the
  /// declared dtype; the others as they are (the inner run checks them).
  TensorMap widen(const TensorMap& tensors) const {
    TensorMap r;
    for (const auto& [name, t] : tensors) {
      const auto it = inputs_.find(name);
      if (it == inputs_.end()) {
        r.emplace(name, t);
        continue;
      }
      const auto& [dtype, declared] = it->second;
      if (t.dtype() != dtype) throw ShapeError("input '" + name + "': expected " + declared + ", got " + t.type_string() + " (dtype differs)");
      r.emplace(name, convert(t, DType::f32, parallel_));
    }
    return r;
  }
  /// Whether an output the inner run gives in `got` is converted to the declared `dtype`: between
  /// f32 and a half type (f32 values of a half type, narrowed exactly; a half value the backend
  /// stored, widened where the graph declares f32). An output in f64 (the reference backend's
  /// f64 outputs, for comparisons) stays as it is.
  static bool converts(DType got, DType dtype) {
    return got != dtype && (got == DType::f32 || is_half(got)) && (dtype == DType::f32 || is_half(dtype));
  }
  /// Outputs in their declared dtypes.
  TensorMap narrow(TensorMap out) const {
    for (auto& [name, t] : out)
      if (auto it = outputs_.find(name); it != outputs_.end() && converts(t.dtype(), it->second)) t = convert(t, it->second, parallel_);
    return out;
  }

  std::unique_ptr<Executable> inner_;
  ParallelFor parallel_;
  std::map<std::string, std::pair<DType, std::string>, std::less<>> inputs_;  // half inputs: dtype, declared type
  std::map<std::string, DType, std::less<>> outputs_;                         // half outputs
};

}  // namespace

Tensor convert(const Tensor& t, DType dtype, const ParallelFor& parallel) {
  constexpr std::int64_t kChunk = std::int64_t{1} << 16;  // elements per task: large enough to stream
  const std::int64_t n = t.numel();
  const bool widen = is_half(t.dtype()) && dtype == DType::f32, narrow = t.dtype() == DType::f32 && is_half(dtype);
  if (!parallel || n <= kChunk || !(widen || narrow)) return t.to(dtype);
  Tensor r = Tensor::uninitialized(dtype, t.shape());
  parallel((n + kChunk - 1) / kChunk, [&](std::int64_t c) {
    const std::int64_t first = c * kChunk, count = std::min(kChunk, n - first);
    if (t.dtype() == DType::f16) to_float(t.data<Half>() + first, r.data<float>() + first, count);
    else if (t.dtype() == DType::bf16) to_float(t.data<BFloat16>() + first, r.data<float>() + first, count);
    else if (dtype == DType::f16) to_half(t.data<float>() + first, r.data<Half>() + first, count);
    else to_bfloat16(t.data<float>() + first, r.data<BFloat16>() + first, count);
  });
  return r;
}

std::unique_ptr<Executable> half_precision_boundary(const ir::Graph& g, std::unique_ptr<Executable> exe, ParallelFor parallel) {
  if (!ir::has_half_values(g)) return exe;
  return std::make_unique<HalfPrecisionExecutable>(g, std::move(exe), std::move(parallel));
}

}  // namespace qkv::backend
