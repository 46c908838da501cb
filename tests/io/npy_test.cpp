// .npy reading and writing: round trips, a file as NumPy writes it, malformed files.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <filesystem>
#include <fstream>

#include "io/npy.hpp"

namespace qkv::io {
namespace {

TEST(Npy, RoundTripsEveryDtype) {
  for (DType dt : {DType::f32, DType::f64, DType::boolean, DType::i32}) {
    Tensor t(dt, {2, 3});
    for (std::int64_t i = 0; i < 6; ++i) {
      if (dt == DType::f32) t.data<float>()[i] = static_cast<float>(i) * 0.5f;
      if (dt == DType::f64) t.data<double>()[i] = static_cast<double>(i) * -0.25;
      if (dt == DType::boolean) t.data<std::uint8_t>()[i] = i % 2;
      if (dt == DType::i32) t.data<std::int32_t>()[i] = static_cast<std::int32_t>(i) - 3;
    }
    Tensor r = parse_npy(format_npy(t), "mem");
    EXPECT_EQ(r.dtype(), dt);
    EXPECT_EQ(r.shape(), t.shape());
    for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(r.at(i), t.at(i));
  }
}

TEST(Npy, ReadsNumpyLayout) {
  // np.save of np.arange(3, dtype=np.float32): header as NumPy 1.24 writes it.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  header.append(128 - 10 - header.size() - 1, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
  float v[3] = {0, 1, 2};
  bytes.append(reinterpret_cast<const char*>(v), sizeof v);
  Tensor t = parse_npy(bytes, "arange.npy");
  EXPECT_EQ(t.shape(), std::vector<std::int64_t>{3});
  EXPECT_EQ(t.at(2), 2.0);
}

TEST(Npy, ScalarAndEmptyShapes) {
  Tensor s(DType::f32, {});
  s.data<float>()[0] = 7;
  EXPECT_EQ(parse_npy(format_npy(s), "s").numel(), 1);
  Tensor e(DType::f32, {0, 4});
  EXPECT_EQ(parse_npy(format_npy(e), "e").shape(), (std::vector<std::int64_t>{0, 4}));
}

TEST(Npy, MalformedFilesGiveClearErrors) {
  auto message = [](const std::string& bytes) {
    try {
      parse_npy(bytes, "bad.npy");
    } catch (const IoError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("hello"), "bad.npy: not a .npy file (bad magic)");
  Tensor t(DType::f32, {4});
  std::string good = format_npy(t);
  EXPECT_NE(message(good.substr(0, good.size() - 4)).find("data holds 12 bytes"), std::string::npos);
  std::string i4 = good;
  i4.replace(i4.find("<f4"), 3, "<i4");
  i4.replace(i4.find("<i4"), 3, "<u2");
  EXPECT_NE(message(i4).find("unsupported dtype '<u2'"), std::string::npos);
  std::string i8 = good;  // 4 int64 values need 32 bytes; the file has 16
  i8.replace(i8.find("<f4"), 3, "<i8");
  EXPECT_NE(message(i8).find("data holds 16 bytes"), std::string::npos);
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  EXPECT_NE(message(fortran).find("Fortran-order"), std::string::npos);
  EXPECT_THROW(read_npy("/nonexistent/x.npy"), IoError);
}

TEST(Npy, WriteLeavesNoPartialFileOnFailure) {
  EXPECT_THROW(write_npy("/nonexistent-dir/x.npy", Tensor(DType::f32, {2})), IoError);
  auto path = std::filesystem::temp_directory_path() / "qkv_npy_test.npy";
  write_npy(path.string(), Tensor(DType::f32, {2}));
  EXPECT_EQ(read_npy(path.string()).numel(), 2);
  std::filesystem::remove(path);
}

TEST(Npy, ConcurrentWritersOfOnePathNeverClobberEachOther) {
  // Each writer has a temporary of its own: every write lands whole, none fails.
  const auto path = (std::filesystem::temp_directory_path() / "qkv_npy_concurrent.npy").string();
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&, w] {
      for (int i = 0; i < 50; ++i) {
        try {
          write_npy(path, Tensor::from<float>({3}, {static_cast<float>(w), 1, 2}));
        } catch (const IoError&) {
          ++failures;
        }
      }
    });
  for (auto& t : writers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(read_npy(path).numel(), 3);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace qkv::io

namespace qkv::io {
namespace {

/// A .npy file with `header` (padded as NumPy pads it) and `data`.
std::string npy_with(const std::string& header, const std::string& data = "") {
  std::string h = header;
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(h.size() & 0xff) + static_cast<char>(h.size() >> 8) + h + data;
}

void expect_npy_error(const std::string& bytes, const std::string& needle) {
  try {
    parse_npy(bytes, "bad.npy");
    ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("bad.npy: ", 0), 0u) << e.what();
  }
}

TEST(Npy, SizesAreCheckedBeforeAnythingIsAllocated) {
  // 40 GB claimed by a 20-byte payload: refused from the header, not by running out of memory.
  expect_npy_error(npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }", std::string(20, 'x')), "needs 40000000000");
  // An element count that overflows 64 bits (it wrapped to 4 before).
  expect_npy_error(npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387905, 4), }", std::string(16, 'x')),
                   "more elements than memory can address");
  expect_npy_error(npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"), "does not fit in 64 bits");
  // A header length past the end of the file.
  expect_npy_error(std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f{", 13), "truncated .npy header");
}

TEST(Npy, TheHeaderIsReadAsPythonReadsIt) {
  expect_npy_error(npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': 5, }"), "'shape' is not a tuple");
  expect_npy_error(npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2abc, 1e9), }"), "not a non-negative integer");
  expect_npy_error(npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }"), "not a non-negative integer");
  expect_npy_error(npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1, }"), "unknown key 'extra'");
  expect_npy_error(npy_with("{'descr': '<f4', 'fortran_order': False}"), "no 'shape'");
  expect_npy_error(npy_with("{'descr': '<f4"), "unterminated string");
  // A later duplicate key wins, as in a Python dict (NumPy keeps the last 'descr').
  float v[2] = {1.5f, -2.0f};
  Tensor t = parse_npy(
      npy_with("{'descr': '<i4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", std::string(reinterpret_cast<const char*>(v), sizeof v)),
      "dup.npy");
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.at(1), -2.0);
}

TEST(Npy, BigEndianFilesAreRead) {
  // np.array([1.5, -2], dtype='>f4') and np.array([7, -1], dtype='>i8').
  const std::string f32("\x3f\xc0\x00\x00\xc0\x00\x00\x00", 8);
  Tensor t = parse_npy(npy_with("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f32), "be.npy");
  EXPECT_EQ(t.at(0), 1.5);
  EXPECT_EQ(t.at(1), -2.0);
  const std::string i64("\x00\x00\x00\x00\x00\x00\x00\x07\xff\xff\xff\xff\xff\xff\xff\xff", 16);
  std::string stored;
  Tensor ids = parse_npy(npy_with("{'descr': '>i8', 'fortran_order': False, 'shape': (2,), }", i64), "be_ids.npy", &stored);
  EXPECT_EQ(ids.dtype(), DType::i32);
  EXPECT_EQ(ids.at(0), 7);
  EXPECT_EQ(ids.at(1), -1);
  EXPECT_EQ(stored, "int64");  // messages name the file's own dtype, not the i32 it is read as
}

}  // namespace
}  // namespace qkv::io
