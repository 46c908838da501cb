// .npy reading and writing.
#include "io/npy.hpp"

#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "io/file.hpp"

namespace qkv::io {

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& why) { throw IoError(what + ": " + why); }

/// A value of the header's Python dict literal: a quoted string, True/False, or a tuple of sizes.
struct HeaderValue {
  enum class Kind { string, boolean, tuple, number } kind = Kind::string;
  std::string text;                 // the string, or the value as written (for messages)
  bool flag = false;                // boolean
  std::vector<std::int64_t> sizes;  // tuple
};

/// Parses the header `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` as NumPy's
/// own reader does (a dict literal whose later duplicate keys win), accepting only what NumPy
/// writes there: quoted strings, True/False, and tuples of non-negative integers.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& what) : text_(text), what_(what) {}

  std::map<std::string, HeaderValue> parse() {
    std::map<std::string, HeaderValue> out;
    expect('{');
    while (!accept('}')) {
      const std::string key = quoted();
      expect(':');
      out[key] = value();  // a later duplicate wins, as in Python
      if (!accept(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) fail("text after the header dict");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { bad(what_, "malformed .npy header (" + why + ")"); }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t' || text_[pos_] == '\r')) ++pos_;
  }
  bool accept(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  std::string quoted() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) fail("expected a quoted string");
    const char q = text_[pos_++];
    const auto end = text_.find(q, pos_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  HeaderValue value() {
    skip_space();
    HeaderValue v;
    if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) {
      v.text = quoted();
      return v;
    }
    if (accept('(')) {
      v.kind = HeaderValue::Kind::tuple;
      while (!accept(')')) {
        v.sizes.push_back(size());
        if (!accept(',')) {
          expect(')');
          break;
        }
      }
      return v;
    }
    if (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {  // read only to say it is not a tuple
      v.kind = HeaderValue::Kind::number;
      v.text = std::to_string(size());
      return v;
    }
    for (const char* word : {"True", "False"})
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += std::strlen(word);
        v.kind = HeaderValue::Kind::boolean;
        v.flag = word[0] == 'T';
        v.text = word;
        return v;
      }
    fail("expected a string, True, False or a tuple");
  }
  std::int64_t size() {
    skip_space();
    std::int64_t d = 0;
    std::size_t digits = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int digit = text_[pos_++] - '0';
      if (d > (std::numeric_limits<std::int64_t>::max() - digit) / 10) fail("a dim does not fit in 64 bits");
      d = d * 10 + digit;
      ++digits;
    }
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2's long suffix
    if (digits == 0 || (pos_ < text_.size() && text_[pos_] != ',' && text_[pos_] != ')' && text_[pos_] != '}' && text_[pos_] != ' '))
      fail("a dim of the shape is not a non-negative integer");
    return d;
  }

  std::string_view text_;
  const std::string& what_;
  std::size_t pos_ = 0;
};

/// How a .npy dtype string is stored: the qkv dtype it reads as, its byte size and order.
struct FileDtype {
  DType dtype;
  std::size_t size;
  bool big_endian;
  const char* name;  // NumPy's name, for messages
};

std::optional<FileDtype> file_dtype(const std::string& descr) {
  if (descr == "|b1" || descr == "<b1" || descr == ">b1" || descr == "?") return FileDtype{DType::boolean, 1, false, "bool"};
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '>' && descr[0] != '=')) return std::nullopt;
  const bool big = descr[0] == '>' || (descr[0] == '=' && std::endian::native == std::endian::big);
  const std::string type = descr.substr(1);
  if (type == "f4") return FileDtype{DType::f32, 4, big, "float32"};
  if (type == "f8") return FileDtype{DType::f64, 8, big, "float64"};
  if (type == "f2") return FileDtype{DType::f16, 2, big, "float16"};
  if (type == "i4") return FileDtype{DType::i32, 4, big, "int32"};
  if (type == "i8") return FileDtype{DType::i32, 8, big, "int64"};  // NumPy's default integer: narrowed to i32
  return std::nullopt;
}

/// The element at `p` of `size` bytes in the file's byte order, as the host's bytes.
void load_element(const char* p, std::size_t size, bool swap, char* out) {
  if (!swap) {
    std::memcpy(out, p, size);
    return;
  }
  for (std::size_t i = 0; i < size; ++i) out[i] = p[size - 1 - i];
}

}  // namespace

Tensor parse_npy(const std::string& bytes, const std::string& what, std::string* stored_as) {
  if (bytes.size() < 10 || std::memcmp(bytes.data(), "\x93NUMPY", 6) != 0) bad(what, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad(what, "truncated .npy header");
    for (std::size_t i = 0; i < 4; ++i) header_len |= static_cast<std::size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    bad(what, "unsupported .npy version " + std::to_string(major));
  }
  if (header_len > bytes.size() - header_start) bad(what, "truncated .npy header");
  auto header = HeaderParser(std::string_view(bytes).substr(header_start, header_len), what).parse();
  for (const auto& [key, value] : header)
    if (key != "descr" && key != "fortran_order" && key != "shape") bad(what, "malformed .npy header (unknown key '" + key + "')");
  auto get = [&](const char* key, HeaderValue::Kind kind, const char* expected) -> const HeaderValue& {
    auto it = header.find(key);
    if (it == header.end()) bad(what, std::string("malformed .npy header (no '") + key + "')");
    if (it->second.kind != kind) bad(what, std::string("malformed .npy header ('") + key + "' is not " + expected + ")");
    return it->second;
  };
  const std::string& descr = get("descr", HeaderValue::Kind::string, "a dtype string").text;
  const bool fortran = get("fortran_order", HeaderValue::Kind::boolean, "True or False").flag;
  const std::vector<std::int64_t>& shape = get("shape", HeaderValue::Kind::tuple, "a tuple").sizes;
  const auto fd = file_dtype(descr);
  if (!fd) bad(what, "unsupported dtype '" + descr + "' (qkv reads float32, float64, float16, int32, int64 and bool)");
  if (stored_as) *stored_as = fd->name;
  if (fortran) bad(what, "Fortran-order arrays are not supported (save with C order)");
  // Every size is checked against the bytes present before anything is allocated.
  const auto n = Tensor::checked_numel(shape, fd->size);
  std::string shape_text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) shape_text += (i ? ", " : "") + std::to_string(shape[i]);
  shape_text += shape.size() == 1 ? ",)" : ")";
  const std::size_t data_start = header_start + header_len, present = bytes.size() - data_start;
  if (!n) bad(what, "shape " + shape_text + " has more elements than memory can address");
  const auto need = static_cast<std::size_t>(*n) * fd->size;
  if (present != need)
    bad(what, "data holds " + std::to_string(present) + " bytes, " + fd->name + " of shape " + shape_text + " needs " + std::to_string(need));
  Tensor t(fd->dtype, shape);
  const char* src = bytes.data() + data_start;
  const bool swap = fd->big_endian && fd->size > 1;
  if (fd->size == 8 && fd->dtype == DType::i32) {
    for (std::int64_t i = 0; i < *n; ++i) {
      std::int64_t v = 0;
      load_element(src + static_cast<std::size_t>(i) * 8, 8, swap, reinterpret_cast<char*>(&v));
      if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
        bad(what, "int64 value " + std::to_string(v) + " does not fit in int32");
      t.data<std::int32_t>()[i] = static_cast<std::int32_t>(v);
    }
  } else if (swap) {
    char* dst = reinterpret_cast<char*>(t.raw());
    for (std::int64_t i = 0; i < *n; ++i)
      load_element(src + static_cast<std::size_t>(i) * fd->size, fd->size, true, dst + static_cast<std::size_t>(i) * fd->size);
  } else if (need) {
    std::memcpy(t.raw(), src, need);
  }
  if (fd->dtype == DType::boolean)
    for (std::int64_t i = 0; i < *n; ++i)
      if (t.data<std::uint8_t>()[i] > 1) bad(what, "bool array holds a byte other than 0 or 1");
  return t;
}

Tensor read_npy(const std::string& path, std::string* stored_as) { return parse_npy(read_file(path), path, stored_as); }

std::string format_npy(const Tensor& t) {
  std::string descr;
  switch (t.dtype()) {
    case DType::f32: descr = "<f4"; break;
    case DType::f64: descr = "<f8"; break;
    case DType::boolean: descr = "|b1"; break;
    case DType::i32: descr = "<i4"; break;
    case DType::f16: descr = "<f2"; break;
    case DType::bf16:
      throw UsageError("a bf16 tensor " + t.type_string() + " has no NumPy dtype: write it to a .safetensors file (BF16), or convert it");
  }
  std::string shape = "(";
  for (std::size_t i = 0; i < t.shape().size(); ++i)
    shape += std::to_string(t.shape()[i]) + (t.shape().size() == 1 || i + 1 < t.shape().size() ? "," : "");
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
