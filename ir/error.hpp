// The qkv error family (user errors) and QKV_ASSERT / QKV_UNREACHABLE (our own bugs).
#pragma once

#include <stdexcept>
#include <string>

namespace qkv {

/// Base of every error qkv reports to users. Messages are lowercase and name op, tensor and dims.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// Shapes or dtypes that do not fit an op, or inputs that do not fit a graph.
class ShapeError : public Error {
 public:
  using Error::Error;
};
/// A backend or device cannot do what was asked (an op it does not support, a missing device).
class UnsupportedError : public Error {
 public:
  using Error::Error;
};
/// A backend failed while starting or running (a Vulkan call, a shader compile).
class BackendError : public Error {
 public:
  using Error::Error;
};
/// Files that cannot be read, written or parsed.
class IoError : public Error {
 public:
  using Error::Error;
};
/// Memory that cannot be had: names the tensor or value and the bytes asked for.
class ResourceError : public Error {
 public:
  using Error::Error;
};
/// IR text that does not parse, or a graph that does not verify.
class IrError : public Error {
 public:
  using Error::Error;
};
/// Another rank of a distributed job, or the MPI runtime under it, failed.
class DistError : public Error {
 public:
  using Error::Error;
};
/// A request that cannot be carried out as given: an unknown model, option, value or flag.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// The exit status of a program that stops on `e`, the one place it is decided: 2 for what the
/// user can fix (usage, shapes, files, IR text, an unsupported request), 1 for a failure (a
/// backend, memory).
int exit_code(const Error& e);

namespace detail {
// __FILE__ and __LINE__ rather than std::source_location, which clang 14 (the fuzz build's
// compiler) cannot provide with libstdc++ 12.
[[noreturn]] void assert_failed(const char* cond, const std::string& message, const char* file, int line);
}  // namespace detail

}  // namespace qkv

/// Checks an invariant of qkv itself; a failure is a bug in qkv, never a user error.
#define QKV_ASSERT(cond, message)                                                    \
  do {                                                                               \
    if (!(cond)) ::qkv::detail::assert_failed(#cond, (message), __FILE__, __LINE__); \
  } while (false)

/// Marks code after an exhaustive switch.
#define QKV_UNREACHABLE(message) ::qkv::detail::assert_failed("unreachable", (message), __FILE__, __LINE__)
