// libFuzzer entry point for the safetensors target (tests/fuzz/targets.hpp).
#include "tests/fuzz/targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  qkv::fuzz::safetensors(data, size);
  return 0;
}
