// Every committed fuzz input (the seed corpora and the regressions the fuzzers found) replayed
// through its target in the ordinary build, so a fixed crash stays fixed under every sanitizer
// the suite runs with.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/fuzz/targets.hpp"

namespace qkv {
namespace {

class FuzzReplay : public ::testing::TestWithParam<const char*> {};

TEST_P(FuzzReplay, EveryCommittedInputPasses) {
  const std::string name = GetParam();
  const auto target = fuzz::target(name);
  ASSERT_NE(target, nullptr);
  int replayed = 0;
  for (const char* kind : {"corpus", "regressions"}) {
    const std::filesystem::path dir = std::filesystem::path(QKV_SOURCE_DIR) / "tests/fuzz" / kind / name;
    ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(e.path(), std::ios::binary);
      const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      SCOPED_TRACE(e.path().string());
      target(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());  // aborts on a broken property
      ++replayed;
    }
  }
  EXPECT_GT(replayed, 0);
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay, ::testing::Values("npy", "safetensors", "ir_text"));

}  // namespace
}  // namespace qkv
