// Configs as reflected structs: a model's config.json read member by member into a struct
// declared with BOOST_HANA_DEFINE_STRUCT, each member from the key of its name. What a key may
// hold follows from the member's type; a key that is missing (where the member is not optional)
// or holds the wrong kind of value is an IoError naming the file and the key.
#pragma once

#include <boost/hana.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "ir/error.hpp"
#include "models/module.hpp"

namespace qkv::models {

namespace detail {

inline const char* json_kind(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a number";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::array: return "a list";
    case nlohmann::json::value_t::object: return "an object";
    default: return "something else";
  }
}

template <class T> const char* wanted() {
  if constexpr (std::is_same_v<T, bool>) return "a boolean";
  else if constexpr (std::is_integral_v<T>) return "an integer";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (is_vector<T>::value) return "a list";
  else return "an object";
}

template <class T> void read_value(const nlohmann::json& j, T& out, const std::string& file, const std::string& key) {
  auto bad = [&] { throw IoError(file + ": \"" + key + "\" is " + json_kind(j) + ", expected " + wanted<T>()); };
  if constexpr (is_optional<T>::value) {
    if (j.is_null()) return out.reset();
    typename T::value_type v{};
    read_value(j, v, file, key);
    out = std::move(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!j.is_boolean()) bad();
    out = j.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!j.is_number_integer()) bad();
    out = j.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!j.is_number()) bad();
    out = j.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!j.is_string()) bad();
    out = j.get<std::string>();
  } else if constexpr (is_vector<T>::value) {
    // A list, or one value where a list of one is meant (eos_token_id is either).
    out.clear();
    if (!j.is_array()) {
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
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto member) {
      const std::string name = boost::hana::to<const char*>(boost::hana::first(member));
      auto& field = boost::hana::second(member)(out);
      const std::string path = key.empty() ? name : key + "." + name;
      auto it = j.find(name);
      if (it == j.end()) {
        if constexpr (is_optional<std::remove_reference_t<decltype(field)>>::value) return;
        else throw IoError(file + ": no \"" + path + "\"");
      } else {
        read_value(*it, field, file, path);
      }
    });
  }
}

}  // namespace detail

/// The config struct `Config` read from parsed JSON (keys it does not declare are ignored, as
/// transformers' configs carry many that do not change the computation).
template <class Config> Config read_config(const nlohmann::json& j, const std::string& file) {
  Config c{};
  detail::read_value(j, c, file, "");
  return c;
}

}  // namespace qkv::models
