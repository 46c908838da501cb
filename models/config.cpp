// JsonRef and JsonDocument over nlohmann::json: the only unit of the config reader that parses
// nlohmann/json.hpp or instantiates its templates.
#include "models/config.hpp"

#include <nlohmann/json.hpp>

#include "io/file.hpp"

namespace qkv::models {

namespace {
const nlohmann::json& json_of(const void* p) { return *static_cast<const nlohmann::json*>(p); }
}  // namespace

const char* JsonRef::kind() const {
  switch (json_of(value_).type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::array: return "a list";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::binary:  // not from a JSON text
    case nlohmann::json::value_t::discarded: break;
  }
  return "something else";
}

bool JsonRef::is_null() const { return json_of(value_).is_null(); }
bool JsonRef::is_boolean() const { return json_of(value_).is_boolean(); }
bool JsonRef::is_integer() const { return json_of(value_).is_number_integer(); }
bool JsonRef::is_number() const { return json_of(value_).is_number(); }
bool JsonRef::is_string() const { return json_of(value_).is_string(); }
bool JsonRef::is_list() const { return json_of(value_).is_array(); }
bool JsonRef::is_object() const { return json_of(value_).is_object(); }
bool JsonRef::boolean() const { return json_of(value_).get<bool>(); }
std::int64_t JsonRef::integer() const { return json_of(value_).get<std::int64_t>(); }
double JsonRef::number() const { return json_of(value_).get<double>(); }
std::string JsonRef::string() const { return json_of(value_).get<std::string>(); }
std::size_t JsonRef::size() const { return json_of(value_).size(); }
JsonRef JsonRef::operator[](std::size_t i) const { return JsonRef(&json_of(value_).at(i)); }

std::optional<JsonRef> JsonRef::find(const std::string& key) const {
  const nlohmann::json& j = json_of(value_);
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end()) return std::nullopt;
  return JsonRef(&*it);
}

std::vector<std::pair<std::string, JsonRef>> JsonRef::items() const {
  std::vector<std::pair<std::string, JsonRef>> all;
  const nlohmann::json& j = json_of(value_);
  if (!j.is_object()) return all;
  for (auto it = j.begin(); it != j.end(); ++it) all.emplace_back(it.key(), JsonRef(&it.value()));
  return all;
}

namespace detail {

void wrong_kind(JsonRef j, const std::string& file, const std::string& key, const char* wanted) {
  throw IoError(file + ": \"" + key + "\" is " + j.kind() + ", expected " + wanted);
}

std::optional<JsonRef> member(JsonRef j, const char* name, const std::string& file, const std::string& key, bool required, std::string& path) {
  path = key.empty() ? std::string(name) : key + "." + name;
  std::optional<JsonRef> value = j.find(name);
  if (!value && required) throw IoError(file + ": no \"" + path + "\"");
  return value;
}

}  // namespace detail

struct JsonDocument::Impl {
  nlohmann::json json;
};

JsonDocument::JsonDocument(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JsonDocument::JsonDocument(JsonDocument&&) noexcept = default;
JsonDocument& JsonDocument::operator=(JsonDocument&&) noexcept = default;
JsonDocument::~JsonDocument() = default;

JsonDocument JsonDocument::parse(const std::string& text, const std::string& what) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(what + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  return JsonDocument(std::move(impl));
}

JsonDocument JsonDocument::read(const std::string& path) { return parse(io::read_file(path), path); }

JsonRef JsonDocument::root() const { return JsonRef(&impl_->json); }

}  // namespace qkv::models
