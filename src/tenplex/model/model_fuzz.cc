// libFuzzer target for the model description parser (model.h), which reads user files
// and the "model" of every version info and prepare request. Besides "no crash, no
// sanitizer report": an accepted model serialises to JSON that parses to the same
// serialisation (a fixed point).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tenplex/model/model.h"
#include "tenplex/util/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  auto m = tenplex::ModelFromJson(in);
  if (!m.ok()) return 0;
  const std::string text = tenplex::ModelToJson(*m);
  auto again = tenplex::ModelFromJson(text);
  tenplex::FuzzRequire(again.ok());
  tenplex::FuzzRequire(tenplex::ModelToJson(*again) == text);
  return 0;
}
