// Reporting of internal assertion failures.
#include "ir/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace qkv::detail {

void assert_failed(const char* cond, const std::string& message, std::source_location where) {
  std::fprintf(stderr, "qkv internal error: %s (%s) at %s:%u\n", message.c_str(), cond,
               where.file_name(), static_cast<unsigned>(where.line()));
  std::abort();
}

}  // namespace qkv::detail
