// Exit codes of the error family, and reporting of internal assertion failures.
#include "ir/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace qkv {

int exit_code(const Error& e) {
  const bool user = dynamic_cast<const UsageError*>(&e) || dynamic_cast<const ShapeError*>(&e) || dynamic_cast<const IoError*>(&e) ||
                    dynamic_cast<const IrError*>(&e) || dynamic_cast<const UnsupportedError*>(&e);
  return user ? 2 : 1;
}

}  // namespace qkv

namespace qkv::detail {

void assert_failed(const char* cond, const std::string& message, const char* file, int line) {
  std::fprintf(stderr, "qkv internal error: %s (%s) at %s:%d\n", message.c_str(), cond, file, line);
  std::abort();
}

}  // namespace qkv::detail
