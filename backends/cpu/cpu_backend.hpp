// The CPU backend: OpenBLAS sgemm for matmul, our own loops for the rest, f32.
#pragma once

#include <memory>

#include "backends/backend.hpp"

namespace qkv::backend {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace qkv::backend
