// The CPU backend: OpenBLAS sgemm for matmul, our own loops for the rest, f32.
#pragma once

#include <memory>

#include "backends/backend.hpp"

namespace qkv::backend {

std::unique_ptr<Backend> make_cpu_backend();

/// Every primitive, and softmax, log_softmax and (fused) attention; other composites decompose.
bool cpu_supports(const ir::Node& n);

}  // namespace qkv::backend
