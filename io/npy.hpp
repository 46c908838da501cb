// NumPy .npy files: reading and writing float32, float64 and bool arrays in C order.
#pragma once

#include <string>

#include "ir/tensor.hpp"

namespace qkv::io {

/// Reads a .npy file (format 1.0-3.0; '<f4', '<f8', '<i4', '|b1', and '<i8' narrowed to i32;
/// C order). Throws IoError naming the
/// file and what is wrong with it.
Tensor read_npy(const std::string& path);
/// Writes a .npy file (format 1.0). Writes to a temporary file and renames it, so a failed write
/// leaves nothing half-written. Throws IoError.
void write_npy(const std::string& path, const Tensor& t);

/// The same, from and to memory.
Tensor parse_npy(const std::string& bytes, const std::string& what);
std::string format_npy(const Tensor& t);

}  // namespace qkv::io
