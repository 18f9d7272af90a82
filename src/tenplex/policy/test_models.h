// GPT presets in a chosen parameter dtype, for the policy's tests.
#pragma once

#include <string>

#include "tenplex/model/gpt.h"

namespace tenplex::policy {

inline Model Gpt(const std::string& preset, const std::string& dtype = "bf16") {
  GptArgs a = *GptPreset(preset);
  a.params_dtype = dtype;
  return *MakeGpt(a);
}

}  // namespace tenplex::policy
