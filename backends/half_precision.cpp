// The executable around a half-precision graph's f32 lowering: dtypes at its boundary.
#include "backends/half_precision.hpp"

#include <map>

#include "ir/passes/passes.hpp"

namespace qkv::backend {

namespace {

class HalfPrecisionExecutable final : public Executable {
 public:
  HalfPrecisionExecutable(const ir::Graph& g, std::unique_ptr<Executable> inner) : inner_(std::move(inner)) {
    for (ir::ValueId v : g.inputs())
      if (is_half(g.node(v).dtype)) inputs_.emplace(g.node(v).name, std::pair{g.node(v).dtype, g.type_string(v)});
    for (const auto& [name, v] : g.outputs())
      if (is_half(g.node(v).dtype)) outputs_.emplace(name, g.node(v).dtype);
  }

  TensorMap run(const TensorMap& inputs) override { return narrow(inner_->run(widen(inputs))); }
  TensorMap run_observed(const TensorMap& inputs, RunObserver& observer) override {
    struct Narrowing final : RunObserver {
      const HalfPrecisionExecutable& exe;
      RunObserver& to;
      Narrowing(const HalfPrecisionExecutable& e, RunObserver& o) : exe(e), to(o) {}
      void output_ready(std::string_view name, const Tensor& value) override {
        const auto it = exe.outputs_.find(name);
        if (it == exe.outputs_.end() || value.dtype() != DType::f32) to.output_ready(name, value);
        else to.output_ready(name, value.to(it->second));
      }
      void between_kernels() override { to.between_kernels(); }
    } narrowing(*this, observer);
    return narrow(inner_->run_observed(widen(inputs), narrowing));
  }
  const ir::Graph& graph() const override { return inner_->graph(); }
  void set_state(const TensorMap& tensors) override { inner_->set_state(widen(tensors)); }
  TensorMap state() override {
    TensorMap s = inner_->state();
    for (auto& [name, t] : s)
      if (auto it = inputs_.find(name); it != inputs_.end()) t = t.to(it->second.first);
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
      r.emplace(name, t.to(DType::f32));
    }
    return r;
  }
  /// Outputs in their declared dtypes (f32 values of a half type, narrowed exactly). An output
  /// in f64 (the reference backend's f64 outputs, for comparisons) stays as it is.
  TensorMap narrow(TensorMap out) const {
    for (auto& [name, t] : out)
      if (auto it = outputs_.find(name); it != outputs_.end() && t.dtype() == DType::f32) t = t.to(it->second);
    return out;
  }

  std::unique_ptr<Executable> inner_;
  std::map<std::string, std::pair<DType, std::string>, std::less<>> inputs_;  // half inputs: dtype, declared type
  std::map<std::string, DType, std::less<>> outputs_;                         // half outputs
};

}  // namespace

std::unique_ptr<Executable> half_precision_boundary(const ir::Graph& g, std::unique_ptr<Executable> exe) {
  if (!ir::has_half_values(g)) return exe;
  return std::make_unique<HalfPrecisionExecutable>(g, std::move(exe));
}

}  // namespace qkv::backend
