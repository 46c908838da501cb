// NumPy .npy files: reading and writing float32, float64, int32 and bool arrays in C order.
#pragma once

#include <string>

#include "ir/tensor.hpp"

namespace qkv::io {

/// Reads a .npy file (format 1.0-3.0; float32, float64, int32 and bool in either byte order, and
/// int64 narrowed to i32 with a range check; C order). Every size in the header is checked for
/// overflow and against the bytes present before anything is allocated. Throws IoError naming
/// the file and what is wrong with it. `stored_as`, when given, receives NumPy's name of the
/// file's dtype ("int64" for a file read as i32), for messages.
Tensor read_npy(const std::string& path, std::string* stored_as = nullptr);
/// Writes a .npy file (format 1.0). Writes to a temporary file and renames it, so a failed write
/// leaves nothing half-written. Throws IoError.
void write_npy(const std::string& path, const Tensor& t);

/// read_npy from memory: `what` names the bytes in errors.
Tensor parse_npy(const std::string& bytes, const std::string& what, std::string* stored_as = nullptr);
/// write_npy to memory: the file's bytes.
std::string format_npy(const Tensor& t);

}  // namespace qkv::io
