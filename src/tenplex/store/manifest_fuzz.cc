// libFuzzer target for the version manifest parser (manifest.h), which a restarting
// daemon runs on every MANIFEST.json of its shared-memory directory. Besides "no
// crash, no sanitizer report": every accepted tensor has a valid key and a byte size
// that matches its dtype and shape.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tenplex/store/manifest.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/fuzz.h"

namespace ts = tenplex::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto m = ts::ParseManifest(in, "j", "3");
  if (!m.ok()) return 0;
  for (const ts::ManifestTensor& t : m->tensors) {
    auto p = ts::ParseTensorPath("jobs/j/3/" + t.key);
    tenplex::FuzzRequire(p.ok() && p->Key() == t.key);
    uint64_t n = tenplex::DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      tenplex::FuzzRequire(d >= 0);
      n *= static_cast<uint64_t>(d);
    }
    tenplex::FuzzRequire(n == t.bytes);
  }
  return 0;
}
