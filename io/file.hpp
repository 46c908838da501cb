// Whole-file reads and atomic writes, shared by the file formats.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace qkv::io {

/// The bytes of `path`, a regular file; throws IoError "PATH: cannot open (reason)", or naming a
/// folder, device or pipe as such.
std::string read_file(const std::string& path);
/// Writes `bytes` to a temporary file beside `path` (named for this process and call), flushes it
/// to disk and renames it into place, so a failed write leaves nothing half-written and concurrent
/// writers of one path never clobber each other's temporary; throws IoError.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// Throws IoError naming `path` and the reason when a file cannot be written there (its folder is
/// missing or not writable, or the path is a folder). For checking every destination of a command
/// before it does any work.
void check_writable(const std::string& path);

/// The same for a folder that files will be written into: it exists and is writable, or it can
/// be made (its nearest existing ancestor is a writable folder).
void check_writable_dir(const std::string& dir);
/// Makes `dir` and its parents; throws IoError naming it and the reason.
void make_dirs(const std::string& dir);

/// Whether `path` is a regular file (or a link to one), and whether it is a folder; false where
/// it cannot be seen.
bool is_file(const std::string& path);
bool is_directory(const std::string& path);
/// `name` inside folder `dir` ("dir/name", one slash between them).
std::string path_in(const std::string& dir, const std::string& name);

/// strerror's text for `err`.
std::string reason(int err);

/// Several files written all or none: each add() writes a temporary beside its path, commit()
/// renames them all into place. Temporaries not committed are removed when the batch goes, so an
/// error in any add() (or before commit) leaves no file written and none half-written.
class OutputBatch {
 public:
  OutputBatch() = default;
  OutputBatch(const OutputBatch&) = delete;
  OutputBatch& operator=(const OutputBatch&) = delete;
  ~OutputBatch();
  void add(const std::string& path, const std::string& bytes);
  void commit();

 private:
  std::vector<std::pair<std::string, std::string>> staged_;  // destination, temporary
};

}  // namespace qkv::io
