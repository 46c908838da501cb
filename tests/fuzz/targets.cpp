// The fuzz targets. User errors (qkv::Error) are the expected answer to bad bytes; anything else
// escaping, a sanitizer report, or a broken round trip is a bug, reported by aborting.
#include "tests/fuzz/targets.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "ir/printer.hpp"

namespace qkv::fuzz {

namespace {

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz property broken: %s\n", what);
  std::abort();
}

bool same(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

}  // namespace

void npy(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  Tensor t;
  try {
    t = io::parse_npy(bytes, "fuzz.npy");
  } catch (const Error&) {
    return;
  }
  if (!same(t, io::parse_npy(io::format_npy(t), "again.npy"))) broken("npy round trip");
}

void safetensors(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  io::TensorFile f;
  try {
    f = io::parse_safetensors(bytes, "fuzz.safetensors");
  } catch (const Error&) {
    return;
  }
  const io::TensorFile again = io::parse_safetensors(io::format_safetensors(f), "again.safetensors");
  if (again.size() != f.size()) broken("safetensors round trip: tensor count");
  for (const auto& [name, t] : f)
    if (!again.contains(name) || !same(t, again.at(name))) broken("safetensors round trip: a tensor");
}

void ir_text(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string printed;
  try {
    printed = ir::print(ir::parse_graph(text));
  } catch (const Error&) {
    return;
  }
  if (ir::print(ir::parse_graph(printed)) != printed) broken("IR text round trip");
}

Target target(std::string_view name) {
  if (name == "npy") return npy;
  if (name == "safetensors") return safetensors;
  if (name == "ir_text") return ir_text;
  return nullptr;
}

}  // namespace qkv::fuzz
