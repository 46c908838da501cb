// The backend registry: one table of names and factories.
#include <cstdlib>

#include "backends/backend.hpp"
#include "backends/cpu/cpu_backend.hpp"
#include "backends/reference/reference_backend.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "ir/error.hpp"

namespace qkv::backend {

namespace {
struct Entry {
  std::string_view name;
  std::unique_ptr<Backend> (*make)();
  bool (*supports)(const ir::Node&);
};
std::unique_ptr<Backend> make_reference() { return make_reference_backend(); }
std::unique_ptr<Backend> make_vulkan() { return make_vulkan_backend(); }
constexpr Entry kBackends[] = {
    {"reference", make_reference, reference_supports}, {"cpu", make_cpu_backend, cpu_supports}, {"vulkan", make_vulkan, vulkan_supports}};
}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> r;
  for (const auto& e : kBackends) r.emplace_back(e.name);
  return r;
}

bool backend_supports(std::string_view name, const ir::Node& n) {
  for (const auto& e : kBackends)
    if (e.name == name) return e.supports(n);
  return create(name)->supports(n);  // reports the unknown name
}

std::unique_ptr<Backend> create(std::string_view name) {
  for (const auto& e : kBackends)
    if (e.name == name) return e.make();
  std::string known;
  for (const auto& e : kBackends) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw UnsupportedError("unknown backend '" + std::string(name) + "' (known: " + known + ")");
}

std::vector<BackendStatus> probe_backends() {
  std::vector<BackendStatus> r;
  for (const auto& e : kBackends) {
    try {
      r.push_back({std::string(e.name), true, e.make()->device()});
    } catch (const Error& err) {
      r.push_back({std::string(e.name), false, err.what()});
    }
  }
  return r;
}

std::string default_backend_name() {
  const char* env = std::getenv("QKV_BACKEND");
  return env && *env ? env : "cpu";
}

}  // namespace qkv::backend
