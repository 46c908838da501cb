// Reporting of internal assertion failures.
#include "ir/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace qkv::detail {

void assert_failed(const char* cond, const std::string& message, const char* file, int line) {
  std::fprintf(stderr, "qkv internal error: %s (%s) at %s:%d\n", message.c_str(), cond, file, line);
  std::abort();
}

}  // namespace qkv::detail
