// Configs as reflected structs: a model's config.json read member by member into a struct
// declared with BOOST_HANA_DEFINE_STRUCT, each member from the key of its name. What a key may
// hold follows from the member's type; a key that is missing (where the member is not optional)
// or holds the wrong kind of value is an IoError naming the file and the key.
//
// The reader sees the parsed document through JsonRef, whose few functions are compiled once in
// config.cpp: the visitors instantiated for every config struct then call them instead of
// nlohmann::json's templates, and a unit that reads configs does not parse nlohmann/json.hpp
// (most of what compiling models/pretrained.cpp cost).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ir/error.hpp"
#include "models/module.hpp"

namespace qkv::models {

/// One value of a parsed JSON document (a view: the document owns it).
class JsonRef {
 public:
  /// "null", "a boolean", "an integer", "a number", "a string", "a list" or "an object".
  const char* kind() const;
  bool is_null() const;
  bool is_boolean() const;
  bool is_integer() const;
  bool is_number() const;  // an integer or not
  bool is_string() const;
  bool is_list() const;
  bool is_object() const;
  bool boolean() const;
  std::int64_t integer() const;
  double number() const;
  std::string string() const;
  std::size_t size() const;  // a list's length
  JsonRef operator[](std::size_t i) const;
  std::optional<JsonRef> find(const std::string& key) const;   // an object's member
  std::vector<std::pair<std::string, JsonRef>> items() const;  // an object's members, by key

 private:
  friend class JsonDocument;
  explicit JsonRef(const void* value) : value_(value) {}
  const void* value_;  // a nlohmann::json
};

/// A JSON file, parsed: an IoError naming the file if it is not JSON.
class JsonDocument {
 public:
  static JsonDocument read(const std::string& path);
  static JsonDocument parse(const std::string& text, const std::string& what);
  JsonDocument(JsonDocument&&) noexcept;
  JsonDocument& operator=(JsonDocument&&) noexcept;
  ~JsonDocument();
  JsonRef root() const;

 private:
  struct Impl;
  explicit JsonDocument(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace detail {

template <class T> const char* wanted() {
  if constexpr (std::is_same_v<T, bool>) return "a boolean";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (is_vector<T>::value) return "a list";
  else return "an object";
}

/// The error of a key holding the wrong kind of value.
[[noreturn]] void wrong_kind(JsonRef j, const std::string& file, const std::string& key, const char* wanted);
/// Member `name` of object `j` (at `key`), its dotted path in `path`; an IoError if it is
/// missing and `required`.
std::optional<JsonRef> member(JsonRef j, const char* name, const std::string& file, const std::string& key, bool required, std::string& path);

template <class T> void read_value(JsonRef j, T& out, const std::string& file, const std::string& key) {
  auto bad = [&] { wrong_kind(j, file, key, wanted<T>()); };
  if constexpr (is_optional<T>::value) {
    if (j.is_null()) return out.reset();
    typename T::value_type v{};
    read_value(j, v, file, key);
    out = std::move(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) bad();
    out = j.boolean();
  } else if constexpr (std::is_integral_v<T>) {
    if (!j.is_integer()) bad();
    out = static_cast<T>(j.integer());
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!j.is_number()) bad();
    out = static_cast<T>(j.number());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) bad();
    out = j.string();
  } else if constexpr (is_vector<T>::value) {
    // A list, or one value where a list of one is meant (eos_token_id is either).
    out.clear();
    if (!j.is_list()) {
      typename T::value_type v{};
      read_value(j, v, file, key);
      out.push_back(std::move(v));
      return;
    }
    for (std::size_t i = 0; i < j.size(); ++i) {
      typename T::value_type v{};
      read_value(j[i], v, file, key + "[" + std::to_string(i) + "]");
      out.push_back(std::move(v));
    }
  } else {
    static_assert(boost::hana::Struct<T>::value, "qkv: a config member is a number, bool, string, list, optional, or a config struct");
    if (!j.is_object()) bad();
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto m) {
      auto& field = boost::hana::second(m)(out);
      constexpr bool required = !is_optional<std::remove_reference_t<decltype(field)>>::value;
      std::string path;
      if (const std::optional<JsonRef> value = member(j, boost::hana::to<const char*>(boost::hana::first(m)), file, key, required, path))
        read_value(*value, field, file, path);
    });
  }
}

}  // namespace detail

/// The config struct `Config` read from a parsed JSON document (keys it does not declare are
/// ignored, as transformers' configs carry many that do not change the computation).
template <class Config> Config read_config(JsonRef j, const std::string& file) {
  Config c{};
  detail::read_value(j, c, file, "");
  return c;
}

}  // namespace qkv::models
