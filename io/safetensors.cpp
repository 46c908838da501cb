// safetensors reading and writing, the header parsed with nlohmann::json.
#include "io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string_view>
#include <vector>

#include "io/file.hpp"

namespace qkv::io {

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& why) { throw IoError(what + ": " + why); }

std::uint64_t read_u64_le(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

struct DtypeInfo {
  const char* name;
  std::size_t size;
};
constexpr DtypeInfo kDtypes[] = {{"F32", 4}, {"F64", 8}, {"BOOL", 1}, {"I32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}};

const char* safetensors_dtype(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::boolean: return "BOOL";
    case DType::i32: return "I32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
  }
  return "?";
}

/// A tensor of the header's `dtype` from its `bytes` at p: a view of them when `owner` keeps them
/// alive (a mapped file) and they are aligned to the element size, a copy otherwise.
Tensor decode(const std::string& dtype, std::vector<std::int64_t> shape, const char* p, std::size_t bytes, const std::string& what,
              const std::shared_ptr<const void>& owner) {
  auto size_of = [&]() -> std::size_t {
    for (const auto& d : kDtypes)
      if (dtype == d.name) return d.size;
    bad(what, "unsupported dtype '" + dtype + "' (F32, F64, F16, BF16, BOOL, I32, I64)");
  }();
  // Sizes are checked against the bytes present before anything is allocated.
  const auto count = Tensor::checked_numel(shape, size_of);
  if (!count) bad(what, "shape has more elements than memory can address");
  const std::int64_t n = *count;
  if (bytes != static_cast<std::size_t>(n) * size_of)
    bad(what, "holds " + std::to_string(bytes) + " bytes, but " + dtype + " of " + std::to_string(n) + " elements needs " +
                  std::to_string(static_cast<std::size_t>(n) * size_of));
  if (dtype == "I64") {
    Tensor t(DType::i32, std::move(shape));
    for (std::int64_t i = 0; i < n; ++i) {
      std::int64_t v = 0;
      std::memcpy(&v, p + 8 * i, 8);
      if (v < std::numeric_limits<std::int32_t>::min() || v > std::numeric_limits<std::int32_t>::max())
        bad(what, "I64 value " + std::to_string(v) + " does not fit i32");
      t.data<std::int32_t>()[i] = static_cast<std::int32_t>(v);
    }
    return t;
  }
  const DType d = dtype == "F32"    ? DType::f32
                  : dtype == "F64"  ? DType::f64
                  : dtype == "F16"  ? DType::f16
                  : dtype == "BF16" ? DType::bf16
                  : dtype == "BOOL" ? DType::boolean
                                    : DType::i32;
  if (owner && d != DType::boolean && reinterpret_cast<std::uintptr_t>(p) % size_of == 0)
    return Tensor::view(d, std::move(shape), reinterpret_cast<const std::byte*>(p), bytes, owner);
  Tensor t(d, std::move(shape));
  if (bytes) std::memcpy(t.raw(), p, bytes);
  if (d == DType::boolean)
    for (std::int64_t i = 0; i < n; ++i)
      if (t.data<std::uint8_t>()[i] > 1) bad(what, "BOOL tensor holds a byte other than 0 or 1");
  return t;
}

/// A file mapped read-only (private: nothing is ever written back).
struct Mapping {
  void* address;
  std::size_t size;
  Mapping(void* a, std::size_t s) : address(a), size(s) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { munmap(address, size); }
};

TensorFile parse(std::string_view bytes, const std::string& what, const std::shared_ptr<const void>& owner) {
  if (bytes.size() < 8) bad(what, "not a safetensors file (shorter than its 8-byte header length)");
  const std::uint64_t header_len = read_u64_le(bytes.data());
  if (header_len > bytes.size() - 8) {
    // A header that starts like JSON but is cut short is a truncated file; anything else is not
    // a safetensors file at all (a .npy file given to --weights, say).
    if (bytes.size() > 8 && bytes[8] == '{' && header_len < (std::uint64_t{1} << 32))
      bad(what, "truncated safetensors file (header of " + std::to_string(header_len) + " bytes, " + std::to_string(bytes.size() - 8) + " present)");
    bad(what, "not a safetensors file (its first 8 bytes are no header length that fits the file)");
  }
  if (header_len == 0 || bytes[8] != '{') bad(what, "not a safetensors file (the header is not a JSON object)");
  nlohmann::json header;
  std::string duplicate;
  // nlohmann keeps the last of duplicate keys; a tensor named twice is an error instead.
  std::vector<std::set<std::string>> keys_at_depth;
  nlohmann::json::parser_callback_t check_duplicates = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) keys_at_depth.emplace_back();
    else if (event == nlohmann::json::parse_event_t::object_end && !keys_at_depth.empty()) keys_at_depth.pop_back();
    else if (event == nlohmann::json::parse_event_t::key && !keys_at_depth.empty() && parsed.is_string() &&
             !keys_at_depth.back().insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = (depth == 1 ? "tensor '" : "key '") + parsed.get<std::string>() + "'";
    return true;
  };
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len), check_duplicates);
  } catch (const nlohmann::json::exception& e) {
    bad(what, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!duplicate.empty()) bad(what, "the header names " + duplicate + " twice");
  if (!header.is_object()) bad(what, "header is not a JSON object");
  const char* data = bytes.data() + 8 + header_len;
  const std::size_t data_size = bytes.size() - 8 - header_len;
  TensorFile out;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = what + ": tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      bad(where, "needs dtype, shape and data_offsets");
    if (!entry["dtype"].is_string()) bad(where, "dtype is not a string");
    std::vector<std::int64_t> shape;
    if (!entry["shape"].is_array()) bad(where, "shape is not an array");
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        bad(where, "shape holds something other than a size");
      shape.push_back(d.get<std::int64_t>());
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(where, "data_offsets is not [begin, end]");
    const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    if (begin > end) bad(where, "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] begin after they end");
    if (end > data_size)
      bad(where,
          "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + ") run past the " + std::to_string(data_size) + " data bytes");
    ranges.emplace_back(begin, end);
    out.emplace(name, decode(entry["dtype"].get<std::string>(), std::move(shape), data + begin, end - begin, where, owner));
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) bad(what, "tensors' data overlap");
  return out;
}

}  // namespace

TensorFile parse_safetensors(const std::string& bytes, const std::string& what) { return parse(bytes, what, nullptr); }

TensorFile read_safetensors(const std::string& path) {
  // Mapped, so that the weights are read in place (pages loaded as they are first touched, shared
  // with the page cache) rather than copied; read whole where a file cannot be mapped.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return parse_safetensors(read_file(path), path);  // read_file names the problem
  struct stat st {};
  void* address = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 8)
    address = ::mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (address == MAP_FAILED) return parse_safetensors(read_file(path), path);
  auto mapping = std::make_shared<const Mapping>(address, static_cast<std::size_t>(st.st_size));
  return parse(std::string_view(static_cast<const char*>(address), mapping->size), path, mapping);
}

std::string format_safetensors(const TensorFile& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", safetensors_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  out += json;
  for (const auto& [name, t] : tensors) out.append(reinterpret_cast<const char*>(t.raw()), t.nbytes());
  return out;
}

void write_safetensors(const std::string& path, const TensorFile& tensors, const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, format_safetensors(tensors, metadata));
}

}  // namespace qkv::io
