// Graphs with f16 and bf16 values on backends whose kernels compute in f32: what every backend's
// compile does with them (ir::emulate_half_precision in its lowering, this around the result).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "backends/backend.hpp"

namespace qkv::backend {

/// `exe`, compiled from `g` by a lowering that computes g's half values in f32 (rounded where
/// they are made: ir::emulate_half_precision), wrapped so that its runs take and return tensors
/// in g's own dtypes: f16 and bf16 inputs (and held state) that the lowering declares f32 widened
/// exactly (those it kept pass as they are), and every output converted to its declared dtype
/// where `exe` gives another float dtype (f32 values of a half type narrowed exactly; a 16-bit
/// value of an output declared f32 widened). An input of another dtype than declared is a
/// ShapeError naming it, as on any graph. `exe` itself when g has no half values.
/// How the conversions at the boundary spread over threads: calls fn(i) for i in [0, n) and
/// returns when all have returned (the cpu backend's pool); empty: on the calling thread.
using ParallelFor = std::function<void(std::int64_t n, const std::function<void(std::int64_t)>& fn)>;
std::unique_ptr<Executable> half_precision_boundary(const ir::Graph& g, std::unique_ptr<Executable> exe, ParallelFor parallel = {});

/// `t` converted to `dtype` (between f32 and f16 or bf16), in chunks spread by `parallel`.
Tensor convert(const Tensor& t, DType dtype, const ParallelFor& parallel);

}  // namespace qkv::backend
