// libFuzzer target for the parallel-config parser (config.h): "tp=2,pp=2,dp=2,zero=1,
// layers=3+3" from command lines, schedules and version infos. Besides "no crash, no
// sanitizer report": an accepted config round-trips through its canonical form, and
// for a small fixed model a config that validates has stage bounds that cover every
// layer in order.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/util/fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto c = tenplex::ParseConfig(in);
  if (!c.ok()) return 0;
  tenplex::FuzzRequire(c->tp >= 1 && c->pp >= 1 && c->dp >= 1);
  auto again = tenplex::ParseConfig(c->ToString());
  tenplex::FuzzRequire(again.ok() && *again == *c && again->ToString() == c->ToString());
  static const tenplex::Model model = [] {
    tenplex::Model m;
    m.num_layers = 6;
    return m;
  }();
  if (auto b = tenplex::StageBounds(model, *c); b.ok()) {
    tenplex::FuzzRequire(b->size() == static_cast<std::size_t>(c->pp) + 1 && b->front() == 0 &&
                         b->back() == 6);
    // Stages of 0 layers are allowed (docs/spec-notes.md: a stage holding only the
    // embedding), so the bounds are non-decreasing.
    for (std::size_t s = 0; s + 1 < b->size(); ++s) tenplex::FuzzRequire((*b)[s] <= (*b)[s + 1]);
  }
  return 0;
}
