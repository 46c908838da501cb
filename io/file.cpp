// Whole-file reads and atomic writes.
#include "io/file.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ir/error.hpp"

namespace qkv::io {

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw IoError(path + ": is a folder, not a file");
  // A device or pipe (/dev/zero, a FIFO) would be read forever or block: only regular files.
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) throw IoError(path + ": is not a regular file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path + ": cannot open (" + reason(errno) + ")");
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw IoError(path + ": cannot read (" + reason(errno) + ")");
  return bytes;
}

std::string reason(int err) { return err ? std::strerror(err) : "unknown reason"; }

void check_writable(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) throw IoError("an output file name is empty");
  if (fs::is_directory(path, ec)) throw IoError(path + ": is a folder; name a file to write");
  const fs::path parent = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::exists(parent, ec)) throw IoError(path + ": cannot write (folder " + parent.string() + " does not exist)");
  if (!fs::is_directory(parent, ec)) throw IoError(path + ": cannot write (" + parent.string() + " is not a folder)");
  if (::access(parent.c_str(), W_OK) != 0) throw IoError(path + ": cannot write (" + reason(errno) + ")");
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0 && !fs::is_symlink(path, ec))
    throw IoError(path + ": cannot write (" + reason(errno) + ")");
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  OutputBatch batch;
  batch.add(path, bytes);
  batch.commit();
}

OutputBatch::~OutputBatch() {
  std::error_code ec;
  for (const auto& [path, tmp] : staged_) std::filesystem::remove(tmp, ec);
}

void OutputBatch::add(const std::string& path, const std::string& bytes) {
  // A name of its own per process and call, so that writers of the same path never share one.
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    if (std::filesystem::is_directory(path)) throw IoError(path + ": is a folder; name a file to write");
    throw IoError(path + ": cannot write (" + reason(errno) + ")");
  }
  staged_.emplace_back(path, tmp);
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int write_err = errno;
  // The data is on disk before the rename makes it visible: a crash leaves the old file or the new.
  const bool flushed = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!written || !flushed || !closed) throw IoError(path + ": write failed (" + reason(written ? errno : write_err) + ")");
}

void OutputBatch::commit() {
  for (std::size_t i = 0; i < staged_.size(); ++i) {
    std::error_code ec;
    std::filesystem::rename(staged_[i].second, staged_[i].first, ec);
    if (ec) throw IoError(staged_[i].first + ": cannot write (" + ec.message() + ")");
    staged_[i].second.clear();
  }
  staged_.clear();
}

void check_writable_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (dir.empty()) throw IoError("an output folder name is empty");
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) throw IoError(dir + ": is a file; name a folder to write into");
    if (::access(dir.c_str(), W_OK) != 0) throw IoError(dir + ": cannot write into the folder (" + reason(errno) + ")");
    return;
  }
  // A folder to be made: its nearest existing ancestor must be a writable folder.
  fs::path up = fs::path(dir).parent_path();
  while (!up.empty() && !fs::exists(up, ec)) up = up.parent_path();
  if (up.empty()) up = ".";
  if (!fs::is_directory(up, ec)) throw IoError(dir + ": cannot make the folder (" + up.string() + " is a file)");
  if (::access(up.c_str(), W_OK) != 0) throw IoError(dir + ": cannot make the folder (" + up.string() + ": " + reason(errno) + ")");
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

std::string path_in(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

void make_dirs(const std::string& dir) {
  check_writable_dir(dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(dir + ": cannot make the folder (" + ec.message() + ")");
}

}  // namespace qkv::io
