// Small helpers the transform agent's files share (agent.h).
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "tenplex/util/json_depth.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A request body that must be a JSON object (of bounded depth).
inline Result<nlohmann::json> ParseRequestBody(const std::string& body) {
  TP_RETURN_IF_ERROR(CheckJsonDepth(body, "request body"));
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("request body is not a JSON object");
  return j;
}

}  // namespace tenplex::cluster
