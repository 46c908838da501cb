// Whole-file reads and atomic writes, shared by the file formats.
#pragma once

#include <string>

namespace qkv::io {

/// The bytes of `path`; throws IoError "PATH: cannot open".
std::string read_file(const std::string& path);
/// Writes `bytes` to a temporary file beside `path` (named for this process and call) and renames
/// it into place, so a failed write leaves nothing half-written and concurrent writers of one path
/// never clobber each other's temporary; throws IoError.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace qkv::io
