// Typed field reads from JSON that came from outside the process.
//
// nlohmann::json::value(key, default) throws type_error when the field exists with
// another type ({"format": []}), which in a daemon or a fuzzed parser is a crash.
// JsonValueOr returns the default both when the field is absent and when it has the
// wrong type, so a reply or file of the wrong shape is refused by the caller's own
// checks, never by an exception.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>

namespace tenplex {

// j[key] when j is an object holding `key` with a value of T's JSON type; `def` otherwise.
// T is bool, an integer type (unsigned types refuse negative numbers), a floating type
// or std::string.
template <class T>
T JsonValueOr(const nlohmann::json& j, std::string_view key, T def) {
  if (!j.is_object()) return def;
  auto it = j.find(key);
  if (it == j.end()) return def;
  if constexpr (std::is_same_v<T, bool>) {
    return it->is_boolean() ? it->template get<bool>() : def;
  } else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) {
    return it->is_number_unsigned() ? it->template get<T>() : def;
  } else if constexpr (std::is_integral_v<T>) {
    return it->is_number_integer() ? it->template get<T>() : def;
  } else if constexpr (std::is_floating_point_v<T>) {
    return it->is_number() ? it->template get<T>() : def;
  } else {
    static_assert(std::is_same_v<T, std::string>, "JsonValueOr: bool, number or std::string");
    return it->is_string() ? it->template get<std::string>() : def;
  }
}

// String overload so a literal default ("") reads as std::string.
inline std::string JsonValueOr(const nlohmann::json& j, std::string_view key, const char* def) {
  return JsonValueOr<std::string>(j, key, std::string(def));
}

}  // namespace tenplex
