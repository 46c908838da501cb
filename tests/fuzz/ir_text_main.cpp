// libFuzzer entry point for the ir_text target (tests/fuzz/targets.hpp).
#include "tests/fuzz/targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  qkv::fuzz::ir_text(data, size);
  return 0;
}
