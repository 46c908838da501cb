// safetensors: files written by PyTorch's tensors through the format's specification (fixtures
// from tests/fixtures/make_torch_fixtures.py), round trips, and malformed files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <utility>

#include "io/npy.hpp"
#include "io/safetensors.hpp"

namespace qkv::io {
namespace {

const std::string kFixtures = std::string(QKV_SOURCE_DIR) + "/tests/fixtures/torch/";

TEST(Safetensors, ReadsEveryDtypeTorchWrites) {
  TensorFile f = read_safetensors(kFixtures + "dtypes.safetensors");
  for (const auto& entry : std::filesystem::directory_iterator(kFixtures + "dtypes")) {
    const std::string name = entry.path().stem().string();
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.contains(name));
    Tensor expected = read_npy(entry.path().string());
    const Tensor& got = f.at(name);
    EXPECT_EQ(got.shape(), expected.shape());
    ASSERT_EQ(got.numel(), expected.numel());
    for (std::int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.at(i), expected.at(i)) << i;
  }
  EXPECT_EQ(f.at("f16").dtype(), DType::f16);  // kept, bits and all
  EXPECT_EQ(f.at("i64").dtype(), DType::i32);  // narrowed
  EXPECT_EQ(f.at("mask").dtype(), DType::boolean);
  EXPECT_EQ(f.size(), 9u);
}

// A file is mapped, not copied: its aligned tensors are views of the mapping, which lives as long
// as one of them does; writing to one copies its bytes first, leaving the file and the others as
// they were.
TEST(Safetensors, ReadsTensorsInPlaceAndCopiesOnWrite) {
  TensorFile written;
  written.emplace("a", Tensor::from<float>({2, 3}, {1, 2, 3, 4, 5, 6}));
  Tensor h(DType::bf16, {5});
  for (int i = 0; i < 5; ++i) h.data<BFloat16>()[i].bits = static_cast<std::uint16_t>(0x3f80 + i);
  written.emplace("h", h);
  written.emplace("m", Tensor::from<bool>({3}, {true, false, true}));
  const std::string path = (std::filesystem::temp_directory_path() / "qkv_mapped.safetensors").string();
  write_safetensors(path, written);
  Tensor a, copy;
  {
    TensorFile f = read_safetensors(path);
    EXPECT_TRUE(f.at("a").is_view());
    EXPECT_TRUE(f.at("h").is_view());
    EXPECT_EQ(f.at("h").dtype(), DType::bf16);
    a = f.at("a");
    copy = a;
    EXPECT_TRUE(copy.is_view());
    EXPECT_EQ(std::as_const(copy).raw(), std::as_const(f).at("a").raw());  // read access: the same bytes
  }                                                                        // the file's map of tensors is gone; the views keep the mapping
  std::filesystem::remove(path);                                           // and the mapping outlives the file's name
  EXPECT_EQ(std::as_const(a).data<float>()[5], 6.0f);
  copy.data<float>()[0] = 42.0f;  // a mutable access: copied first
  EXPECT_FALSE(copy.is_view());
  EXPECT_TRUE(a.is_view());
  EXPECT_EQ(std::as_const(a).data<float>()[0], 1.0f);
  EXPECT_EQ(copy.data<float>()[0], 42.0f);
  EXPECT_EQ(copy.data<float>()[5], 6.0f);
  // Parsed from memory, tensors own their bytes.
  EXPECT_FALSE(parse_safetensors(format_safetensors(written), "memory").at("a").is_view());
}

// Half-precision tensors keep their dtype and bits through a file: every f16 and bf16 pattern
// (NaNs, infinities, subnormals, both zeros included).
TEST(Safetensors, HalfPrecisionRoundTripsBitExact) {
  Tensor h(DType::f16, {65536}), b(DType::bf16, {256, 256});
  for (std::int64_t i = 0; i < 65536; ++i) {
    h.data<Half>()[i].bits = static_cast<std::uint16_t>(i);
    b.data<BFloat16>()[i].bits = static_cast<std::uint16_t>(65535 - i);
  }
  TensorFile t;
  t.emplace("h", h);
  t.emplace("b", b);
  const TensorFile back = parse_safetensors(format_safetensors(t), "memory");
  ASSERT_EQ(back.at("h").dtype(), DType::f16);
  ASSERT_EQ(back.at("b").dtype(), DType::bf16);
  EXPECT_EQ(back.at("b").shape(), b.shape());
  EXPECT_EQ(std::memcmp(back.at("h").raw(), h.raw(), h.nbytes()), 0);
  EXPECT_EQ(std::memcmp(back.at("b").raw(), b.raw(), b.nbytes()), 0);
  // f16 through .npy too ('<f2'); bf16 has no NumPy dtype, and says so.
  const Tensor again = parse_npy(format_npy(h), "memory.npy");
  ASSERT_EQ(again.dtype(), DType::f16);
  EXPECT_EQ(std::memcmp(again.raw(), h.raw(), h.nbytes()), 0);
  try {
    (void)format_npy(b);
    ADD_FAILURE() << "bf16 written as .npy";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 tensor bf16[256,256] has no NumPy dtype"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RoundTripsAndWritesAlignedData) {
  TensorFile t;
  t.emplace("a.weight", Tensor::from<float>({2, 2}, {1, 2, 3, 4}));
  t.emplace("b", Tensor::from<std::int32_t>({3}, {-1, 0, 5}));
  t.emplace("m", Tensor::from<bool>({2}, {true, false}));
  const std::string bytes = format_safetensors(t, {{"format", "pt"}});
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  EXPECT_EQ((8 + header) % 8, 0u);
  TensorFile back = parse_safetensors(bytes, "memory");
  ASSERT_EQ(back.size(), 3u);
  for (const auto& [name, tensor] : t) {
    EXPECT_EQ(back.at(name).dtype(), tensor.dtype()) << name;
    for (std::int64_t i = 0; i < tensor.numel(); ++i) EXPECT_EQ(back.at(name).at(i), tensor.at(i)) << name;
  }
  const std::string path = ::testing::TempDir() + "/qkv_roundtrip.safetensors";
  write_safetensors(path, t);
  EXPECT_EQ(read_safetensors(path).size(), 3u);
  for (const auto& e : std::filesystem::directory_iterator(::testing::TempDir()))
    EXPECT_EQ(e.path().filename().string().rfind("qkv_roundtrip.safetensors.tmp", 0), std::string::npos) << "left behind: " << e.path();
}

std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

void expect_error(const std::string& bytes, const std::string& fragment) {
  try {
    parse_safetensors(bytes, "bad.safetensors");
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("bad.safetensors", 0), 0u) << "names the file: " << e.what();
  }
}

TEST(Safetensors, SizesAndOffsetsAreCheckedBeforeUse) {
  // [2^40, 2^40] elements overflowed to "0 elements" before.
  expect_error(with_header(R"({"w":{"dtype":"F16","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}})", ""),
               "more elements than memory can address");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", "12345678"), "[8, 4] begin after they end");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "1234"),
               "names tensor 'w' twice");
  // A .npy file given as weights is "not a safetensors file", not a header length.
  expect_error(std::string("\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 64), "not a safetensors file");
}

TEST(Safetensors, MalformedFilesGiveClearErrors) {
  expect_error("abc", "shorter than");
  expect_error(with_header("{}", "").substr(0, 8) + std::string("\xff", 1), "not a safetensors file");
  std::string huge(8, '\xff');
  expect_error(huge + "{}", "not a safetensors file");
  expect_error(with_header("{not json", ""), "not valid JSON");
  expect_error(with_header("[1,2]", ""), "not a JSON object");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[2]}})", ""), "needs dtype, shape and data_offsets");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"), "run past the 4 data bytes");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678"), "needs 12");
  expect_error(with_header(R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", "12345678"), "unsupported dtype 'C64'");
  expect_error(with_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "1234"), "shape holds");
  expect_error(
      with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "12345678"),
      "overlap");
  expect_error(with_header(R"({"m":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", "\x02"), "other than 0 or 1");
  EXPECT_THROW(read_safetensors("/nonexistent/file.safetensors"), IoError);
}

}  // namespace
}  // namespace qkv::io
