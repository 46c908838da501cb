// .npy reading and writing.
#include "io/npy.hpp"

#include "io/file.hpp"

#include <cstdio>
#include <cstring>
#include <sstream>

namespace qkv::io {

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& why) { throw IoError(what + ": " + why); }

/// The value of `key` in the header dict, e.g. 'descr': '<f4'.
std::string header_value(const std::string& header, const std::string& key, const std::string& what) {
  auto k = header.find("'" + key + "'");
  if (k == std::string::npos) bad(what, "malformed .npy header (no '" + key + "')");
  auto colon = header.find(':', k);
  if (colon == std::string::npos) bad(what, "malformed .npy header");
  auto start = header.find_first_not_of(' ', colon + 1);
  if (start == std::string::npos) bad(what, "malformed .npy header");
  std::size_t end = start;
  if (header[start] == '\'') end = header.find('\'', start + 1) + 1;
  else if (header[start] == '(') end = header.find(')', start) + 1;
  else end = header.find_first_of(",}", start);
  if (end == std::string::npos || end == 0) bad(what, "malformed .npy header");
  return header.substr(start, end - start);
}

}  // namespace

Tensor parse_npy(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) bad(what, "not a .npy file (bad magic)");
  int major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(what, "truncated .npy header");
    for (int i = 0; i < 4; ++i) header_len |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + static_cast<std::size_t>(i)])) << (8 * i);
    header_start = 12;
  } else {
    bad(what, "unsupported .npy version " + std::to_string(major));
  }
  if (bytes.size() < header_start + header_len) bad(what, "truncated .npy header");
  std::string header = bytes.substr(header_start, header_len);
  std::string descr = header_value(header, "descr", what);
  std::string order = header_value(header, "fortran_order", what);
  std::string shape_text = header_value(header, "shape", what);
  DType dtype;
  bool int64 = false;  // NumPy's default integer: read and narrowed to i32
  if (descr == "'<f4'") dtype = DType::f32;
  else if (descr == "'<f8'") dtype = DType::f64;
  else if (descr == "'|b1'") dtype = DType::boolean;
  else if (descr == "'<i4'") dtype = DType::i32;
  else if (descr == "'<i8'") dtype = DType::i32, int64 = true;
  else bad(what, "unsupported dtype " + descr + " (qkv reads float32, float64, int32, int64 and bool)");
  if (order != "False") bad(what, "Fortran-order arrays are not supported (save with C order)");
  std::vector<std::int64_t> shape;
  std::string inner = shape_text.substr(1, shape_text.size() - 2);
  std::stringstream ss(inner);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto s = item.find_first_not_of(' ');
    if (s == std::string::npos) continue;
    try {
      std::size_t used = 0;
      long long d = std::stoll(item.substr(s), &used);
      if (d < 0) throw std::invalid_argument("negative");
      shape.push_back(d);
    } catch (const std::exception&) {
      bad(what, "malformed shape " + shape_text);
    }
  }
  Tensor t(dtype, shape);
  std::size_t data_start = header_start + header_len;
  const std::size_t need = int64 ? t.nbytes() * 2 : t.nbytes();
  if (bytes.size() - data_start != need)
    bad(what, "data holds " + std::to_string(bytes.size() - data_start) + " bytes, shape " + shape_text + " needs " + std::to_string(need));
  if (int64) {
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      std::int64_t v;
      std::memcpy(&v, bytes.data() + data_start + static_cast<std::size_t>(i) * 8, 8);
      if (v < INT32_MIN || v > INT32_MAX) bad(what, "int64 value " + std::to_string(v) + " does not fit in int32");
      t.data<std::int32_t>()[i] = static_cast<std::int32_t>(v);
    }
  } else if (t.nbytes()) {
    std::memcpy(t.raw(), bytes.data() + data_start, t.nbytes());
  }
  if (dtype == DType::boolean)
    for (std::int64_t i = 0; i < t.numel(); ++i)
      if (t.data<std::uint8_t>()[i] > 1) bad(what, "bool array holds a byte other than 0 or 1");
  return t;
}

Tensor read_npy(const std::string& path) { return parse_npy(read_file(path), path); }

std::string format_npy(const Tensor& t) {
  std::string descr;
  switch (t.dtype()) {
    case DType::f32: descr = "<f4"; break;
    case DType::f64: descr = "<f8"; break;
    case DType::boolean: descr = "|b1"; break;
    case DType::i32: descr = "<i4"; break;
  }
  std::string shape = "(";
  for (std::size_t i = 0; i < t.shape().size(); ++i) shape += std::to_string(t.shape()[i]) + (t.shape().size() == 1 || i + 1 < t.shape().size() ? "," : "");
  shape += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(t.raw()), t.nbytes());
  return out;
}

void write_npy(const std::string& path, const Tensor& t) { write_file_atomic(path, format_npy(t)); }

}  // namespace qkv::io
