// libFuzzer target for the elastic schedule parser (schedule.h) of `tenplex run
// --schedule`. Besides "no crash, no sanitizer report": an accepted schedule starts at
// step 0, its steps increase, and it ends with its only stop entry.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tenplex/runtime/schedule.h"
#include "tenplex/util/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  static const tenplex::Model model = [] {
    tenplex::Model m;
    m.num_layers = 4;
    return m;
  }();
  auto s = tenplex::runtime::ParseSchedule(in, model);
  if (!s.ok()) return 0;
  tenplex::FuzzRequire(s->size() >= 2 && s->front().step == 0 && s->back().stop);
  for (std::size_t i = 0; i + 1 < s->size(); ++i) {
    tenplex::FuzzRequire(!(*s)[i].stop && (*s)[i].step < (*s)[i + 1].step);
  }
  return 0;
}
