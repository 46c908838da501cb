// safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the
// tensors' bytes. What PyTorch users export weights with.
#pragma once

#include <map>
#include <string>

#include "ir/tensor.hpp"

namespace qkv::io {

/// A safetensors file's tensors, by name.
using TensorFile = std::map<std::string, Tensor, std::less<>>;

/// Reads every tensor of a .safetensors file. F32, F64, F16, BF16, BOOL and I32 as they are (a
/// checkpoint's half-precision weights keep their dtype and bits); I64 narrowed to i32 with a
/// range check. The file is memory-mapped and its tensors are views of it (Tensor::view: no copy
/// until one is written; the mapping lives as long as one of them), except where it cannot be
/// mapped or a tensor's bytes are not aligned to its elements. Throws IoError naming the file and
/// what is wrong (truncated header, bad JSON, offsets outside the data or overlapping, sizes that
/// disagree with shape and dtype, unknown dtypes).
TensorFile read_safetensors(const std::string& path);
/// Writes tensors as a .safetensors file (sorted by name, data aligned to 8 bytes), through a
/// temporary file renamed into place, so a failed write leaves nothing half-written.
void write_safetensors(const std::string& path, const TensorFile& tensors, const std::map<std::string, std::string>& metadata = {});

/// read_safetensors from memory: `what` names the bytes in errors. The tensors are copies.
TensorFile parse_safetensors(const std::string& bytes, const std::string& what);
/// write_safetensors to memory: the file's bytes.
std::string format_safetensors(const TensorFile& tensors, const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv::io
