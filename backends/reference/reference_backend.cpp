// The reference backend: composites run as their decompositions; each primitive is a plain loop.
#include "backends/reference/reference_backend.hpp"

#include <algorithm>
#include <limits>

#include "backends/executable_skeleton.hpp"
#include "backends/half_precision.hpp"
#include "backends/host_kernels.hpp"
#include "backends/kernel_util.hpp"
#include "backends/scalar_ops.hpp"
#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"

namespace qkv::backend {

namespace {

using ir::Node;
using ir::Op;
using ir::Shape;

template <class T> class ReferenceExecutable final : public ExecutableSkeleton {
 public:
  ReferenceExecutable(ir::Graph g, const ReferenceOptions& o)
      : ExecutableSkeleton(std::move(g)), f64_outputs_(o.f64_outputs), f64_inputs_(o.f64_inputs), reversed_(o.reversed_sums),
        flip_(o.flipped_half_roundings) {}

  std::int64_t planned_bytes() const override { return planned_bytes_; }

  void set_state(TensorMap tensors) override {
    check_state_names(graph_, tensors);
    state_ = std::move(tensors);
  }
  TensorMap state() override { return state_; }

  /// One vector per node, as long as its shape (values are never freed during a run: the oracle
  /// keeps it simple).
  void plan() override {
    bind_shapes(f64_inputs_);
    values_.assign(graph_.size(), {});
    planned_bytes_ = 0;
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      const std::int64_t bytes = shapes_[i].numel() * static_cast<std::int64_t>(sizeof(T));
      try {
        values_[i].resize(static_cast<std::size_t>(shapes_[i].numel()));
      } catch (const std::bad_alloc&) {
        values_.clear();
        throw ResourceError("reference: out of memory: %" + std::to_string(i) + " " + std::string(ir::op_name(graph_.nodes()[i].op)) + " " +
                            graph_.type_string(graph_.nodes()[i].dtype, shapes_[i]) + " needs " + std::to_string(bytes) + " bytes");
      }
      planned_bytes_ += bytes;
    }
  }
  void compute() override {
    const TensorMap inputs = merged_inputs(graph_, tensors_);
    for (std::size_t i = 0; i < graph_.size(); ++i) {
      std::fill(values_[i].begin(), values_[i].end(), T(0));  // each run starts from zeros, as a fresh plan does
      eval(graph_.nodes()[i], shapes_, values_, i, inputs);
      computed(static_cast<ir::ValueId>(i));
    }
    for (const auto& [name, v] : graph_.updates()) {
      Tensor& held = state_.at(name);
      const auto& vals = values_[static_cast<std::size_t>(v)];
      for (std::size_t j = 0; j < vals.size(); ++j) {
        if (held.dtype() == DType::f64) held.data<double>()[j] = static_cast<double>(vals[j]);
        else held.data<float>()[j] = static_cast<float>(vals[j]);
      }
    }
  }
  Tensor output(std::string_view, ir::ValueId v) override {
    const auto& vals = values_[static_cast<std::size_t>(v)];
    DType dt = graph_.node(v).dtype;
    if (dt == DType::f32 && f64_outputs_) dt = DType::f64;
    Tensor t(dt, ir::to_vector(shapes_[static_cast<std::size_t>(v)]));
    for (std::size_t j = 0; j < vals.size(); ++j) {
      switch (dt) {
        case DType::f32: t.data<float>()[j] = static_cast<float>(vals[j]); break;
        case DType::f64: t.data<double>()[j] = static_cast<double>(vals[j]); break;
        case DType::boolean: t.data<std::uint8_t>()[j] = vals[j] != T(0); break;
        case DType::i32: t.data<std::int32_t>()[j] = static_cast<std::int32_t>(vals[j]); break;
        case DType::f16: t.data<Half>()[j] = to_half(static_cast<double>(vals[j])); break;
        case DType::bf16: t.data<BFloat16>()[j] = to_bfloat16(static_cast<double>(vals[j])); break;
      }
    }
    return t;
  }

 private:
  /// Moves about half the values a rounding changed, chosen by a hash of the seed, the node and
  /// the element, to the format's other neighbour of their unrounded value `before`
  /// (ReferenceOptions::flipped_half_roundings); values the rounding left alone stay.
  void flip(const std::vector<T>& before, std::vector<T>& out, std::size_t self, DType format) const {
    const int mantissa = format == DType::f16 ? 10 : 7, least_exponent = format == DType::f16 ? -14 : -126;
    for (std::size_t j = 0; j < out.size(); ++j) {
      const double x = static_cast<double>(before[j]), y = static_cast<double>(out[j]);
      if (x == y || !std::isfinite(x) || !std::isfinite(y)) continue;
      std::uint64_t h = (static_cast<std::uint64_t>(flip_) << 48) ^ (static_cast<std::uint64_t>(self) << 32) ^ j;
      h = (h ^ (h >> 31)) * 0x7fb5d329728ea185ull;
      h = (h ^ (h >> 27)) * 0x81dadef4bc2dd44dull;
      if ((h >> 63) == 0) continue;
      const double magnitude = std::fabs(y);
      const int e = magnitude == 0 ? least_exponent : std::max(std::ilogb(magnitude), least_exponent);
      double step = std::ldexp(1.0, e - mantissa);
      // Toward zero from a power of two (a normal one), the spacing below is half the spacing above.
      const bool shrinks = magnitude != 0 && (x < y) == (y > 0);
      if (shrinks && e > least_exponent && magnitude == std::ldexp(1.0, e)) step /= 2;
      out[j] = static_cast<T>(x > y ? y + step : y - step);
    }
  }

  void eval(const Node& n, const std::vector<Shape>& shapes, std::vector<std::vector<T>>& values, std::size_t self, const TensorMap& inputs) {
    std::vector<T>& out = values[self];
    const Shape& os = shapes[self];
    auto in = [&](int k) -> const std::vector<T>& { return values[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(k)])]; };
    auto in_shape = [&](int k) -> const Shape& { return shapes[static_cast<std::size_t>(n.inputs[static_cast<std::size_t>(k)])]; };
    const bool reversed = reversed_;
    // clang-format cannot read case lists (QKV_*_CASES, macros): this switch is laid out by hand.
    // clang-format off
    switch (n.op) {
      case Op::input: {
        const Tensor& t = inputs.find(n.name)->second;
        for (std::size_t j = 0; j < out.size(); ++j) out[j] = static_cast<T>(t.at(static_cast<std::int64_t>(j)));
        return;
      }
      case Op::constant: std::fill(out.begin(), out.end(), static_cast<T>(ir::bound_value(graph_, n, shapes))); return;
      QKV_UNARY_CASES
      case Op::cast:
        for (std::size_t j = 0; j < out.size(); ++j) out[j] = apply_unary(n.op, in(0)[j]);
        if (flip_ != 0 && (n.op == Op::round_f16 || n.op == Op::round_bf16)) flip(in(0), out, self, n.op == Op::round_f16 ? DType::f16 : DType::bf16);
        return;
      QKV_BINARY_CASES
      QKV_COMPARE_CASES {
        OffsetWalker<2> w{os, {broadcast_strides(in_shape(0), os), broadcast_strides(in_shape(1), os)}};
        for (std::size_t j = 0; j < out.size(); ++j, w.next())
          out[j] = apply_binary(n.op, in(0)[static_cast<std::size_t>(w.offset[0])], in(1)[static_cast<std::size_t>(w.offset[1])]);
        return;
      }
      case Op::where: {
        OffsetWalker<3> w{os, {broadcast_strides(in_shape(0), os), broadcast_strides(in_shape(1), os), broadcast_strides(in_shape(2), os)}};
        for (std::size_t j = 0; j < out.size(); ++j, w.next())
          out[j] = in(0)[static_cast<std::size_t>(w.offset[0])] != T(0) ? in(1)[static_cast<std::size_t>(w.offset[1])]
                                                                        : in(2)[static_cast<std::size_t>(w.offset[2])];
        return;
      }
      QKV_REDUCE_CASES {
        AxisSplit s = split_at(in_shape(0), n.attrs.axis);
        const auto& x = in(0);
        for (std::int64_t o = 0; o < s.outer; ++o)
          for (std::int64_t i = 0; i < s.inner; ++i) {
            T acc = n.op == Op::reduce_sum ? T(0) : -std::numeric_limits<T>::infinity();
            for (std::int64_t step = 0; step < s.n; ++step) {
              const std::int64_t k = reversed ? s.n - 1 - step : step;
              T v = x[static_cast<std::size_t>((o * s.n + k) * s.inner + i)];
              acc = n.op == Op::reduce_sum ? acc + v : apply_binary(Op::max, acc, v);
            }
            out[static_cast<std::size_t>(o * s.inner + i)] = acc;
          }
        return;
      }
      case Op::matmul: {
        bool ta = n.attrs.transpose_a, tb = n.attrs.transpose_b;
        MatmulDims d = matmul_dims(in_shape(0), in_shape(1), os, ta);
        const auto& a = in(0);
        const auto& b = in(1);
        OffsetWalker<2> w{d.batch_shape, {d.a_batch, d.b_batch}};
        for (std::int64_t bt = 0; bt < d.batch; ++bt, w.next()) {
          const T* pa = a.data() + w.offset[0] * d.m * d.k;
          const T* pb = b.data() + w.offset[1] * d.k * d.n;
          T* pc = out.data() + bt * d.m * d.n;
          for (std::int64_t i = 0; i < d.m; ++i)
            for (std::int64_t j = 0; j < d.n; ++j) {
              T acc = 0;
              for (std::int64_t step = 0; step < d.k; ++step) {
                const std::int64_t k = reversed ? d.k - 1 - step : step;
                acc += pa[ta ? k * d.m + i : i * d.k + k] * pb[tb ? j * d.k + k : k * d.n + j];
              }
              pc[i * d.n + j] = acc;
            }
        }
        return;
      }
      case Op::permute: {
        Strides src = contiguous_strides(in_shape(0));
        Strides st{};
        for (int i = 0; i < os.rank; ++i) st[static_cast<std::size_t>(i)] = src[static_cast<std::size_t>(n.attrs.perm[static_cast<std::size_t>(i)])];
        OffsetWalker<1> w{os, {st}};
        for (std::size_t j = 0; j < out.size(); ++j, w.next()) out[j] = in(0)[static_cast<std::size_t>(w.offset[0])];
        return;
      }
      case Op::reshape: out = in(0); return;
      case Op::broadcast_to: {
        OffsetWalker<1> w{os, {broadcast_strides(in_shape(0), os)}};
        for (std::size_t j = 0; j < out.size(); ++j, w.next()) out[j] = in(0)[static_cast<std::size_t>(w.offset[0])];
        return;
      }
      case Op::one_hot: {
        const auto depth = n.attrs.depth;
        std::fill(out.begin(), out.end(), T(0));
        for (std::size_t j = 0; j < in(0).size(); ++j) {
          auto id = static_cast<std::int64_t>(in(0)[j]);
          if (id >= 0 && id < depth) out[j * static_cast<std::size_t>(depth) + static_cast<std::size_t>(id)] = T(1);
        }
        return;
      }
      case Op::embedding: {
        const auto rows = static_cast<std::size_t>(in_shape(1)[0]);
        const std::size_t width = rows == 0 ? 0 : in(1).size() / rows;
        for (std::size_t j = 0; j < in(0).size(); ++j) {
          const auto id = static_cast<std::int64_t>(in(0)[j]);
          for (std::size_t c = 0; c < width; ++c)
            out[j * width + c] = id >= 0 && static_cast<std::size_t>(id) < rows ? in(1)[static_cast<std::size_t>(id) * width + c] : T(0);
        }
        return;
      }
      case Op::causal_mask: return causal_mask_kernel(os[0], os[1], n.attrs.align, n.attrs.window, out.data());
      case Op::slice: {
        AxisSplit s = split_at(in_shape(0), n.attrs.axis);
        return slice_rows(in(0).data(), s.outer, s.n, s.inner, n.attrs.begin, os[n.attrs.axis], out.data());
      }
      case Op::concat: {
        AxisSplit s = split_at(in_shape(0), n.attrs.axis);
        return concat_rows(in(0).data(), s.n, in(1).data(), in_shape(1)[n.attrs.axis], s.outer, s.inner, out.data());
      }
      case Op::cache_write: {
        AxisSplit s = split_at(in_shape(0), n.attrs.axis);
        return cache_write_rows(in(0).data(), in(1).data(), s.outer, s.n, in_shape(1)[n.attrs.axis], s.inner, static_cast<std::int64_t>(in(2)[0]),
                                out.data());
      }
      case Op::page_write: {
        const Shape& pages = in_shape(0);
        const Shape& fresh = in_shape(1);
        return page_write_rows(in(0).data(), in(1).data(), in(2).data(), pages[0], pages[1], pages[2], pages[3], fresh[0], fresh[2], out.data());
      }
      case Op::iota: return iota_kernel(split_at(os, n.attrs.axis), out.data());
      case Op::dropout_mask:
        return dropout_mask_kernel(dropout_seed(in(1)[0]), n.attrs.dropout, static_cast<std::int64_t>(out.size()), out.data());
      QKV_ATTENTION_CASES
      QKV_COMPOSITE_CASES break;
    }
    // clang-format on
    QKV_UNREACHABLE(std::string(ir::op_name(n.op)) + " reached the reference backend undecomposed");
  }

  bool f64_outputs_;
  bool f64_inputs_;
  bool reversed_;                       // sums from the last term
  std::uint32_t flip_;                  // ReferenceOptions::flipped_half_roundings
  std::vector<std::vector<T>> values_;  // per node, as planned
  std::int64_t planned_bytes_ = 0;
};

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(ReferenceOptions o) : options_(o) {}
  std::string name() const override { return "reference"; }
  std::string device() const override {
    return options_.precision == Precision::f64 ? "host, plain loops in double precision" : "host, plain loops in single precision";
  }
  bool supports(const Node& n) const override { return reference_supports(n); }
  std::string determinism() const override {
    return "every kernel: plain loops in a fixed order, the same bits every run, and a sequence's the same alone or anywhere in a batch "
           "(but dropout's masks, keyed by the position in the batch)";
  }
  std::string kernel_name(const ir::Graph& g, ir::ValueId v) const override {
    if (g.node(v).op == Op::input) return "(input)";
    return options_.precision == Precision::f64 ? "loop in double" : "loop in float";
  }
  std::unique_ptr<Executable> compile(const ir::Graph& g) override {
    ir::Graph lowered = ir::lower_for_backend(g, [this](const Node& n) { return supports(n); });
    if (options_.precision == Precision::f64)
      return half_precision_boundary(g, std::make_unique<ReferenceExecutable<double>>(std::move(lowered), options_));
    return half_precision_boundary(g, std::make_unique<ReferenceExecutable<float>>(std::move(lowered), options_));
  }

 private:
  ReferenceOptions options_;
};

}  // namespace

bool reference_supports(const ir::Node& n) { return ir::op_info(n.op).category != ir::OpCategory::composite; }

std::unique_ptr<Backend> make_reference_backend(ReferenceOptions options) { return std::make_unique<ReferenceBackend>(options); }

}  // namespace qkv::backend
