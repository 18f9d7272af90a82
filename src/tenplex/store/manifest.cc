#include "tenplex/store/manifest.h"

#include <nlohmann/json.hpp>

#include "tenplex/store/parse.h"
#include "tenplex/util/json_depth.h"
#include "tenplex/util/json_value.h"

namespace tenplex::store {

using nlohmann::json;

Result<Manifest> ParseManifest(std::string_view text, std::string_view job,
                               std::string_view version) {
  json m = CheckJsonDepth(text).ok() ? json::parse(text, nullptr, false) : json();
  if (m.is_discarded() || !m.is_object() || JsonValueOr(m, "format", "") != kManifestFormat ||
      !m.contains("tensors") || !m["tensors"].is_array()) {
    return DataLoss(std::string("not a ") + kManifestFormat + " manifest");
  }
  Manifest out;
  if (m.contains("info") && m["info"].is_object()) out.info = m["info"].dump();
  for (const json& t : m["tensors"]) {
    if (!t.is_object() || !t.contains("key") || !t["key"].is_string() || !t.contains("dtype") ||
        !t["dtype"].is_string() || !t.contains("shape") || !t["shape"].is_array()) {
      return DataLoss("malformed tensor entry");
    }
    ManifestTensor en;
    en.key = t["key"].get<std::string>();
    auto p =
        ParseTensorPath("jobs/" + std::string(job) + "/" + std::string(version) + "/" + en.key);
    if (!p.ok()) return DataLoss(p.status().message());
    auto dt = ParseDType(t["dtype"].get<std::string>());
    if (!dt.ok()) return DataLoss(dt.status().message());
    en.dtype = *dt;
    for (const json& d : t["shape"]) {
      if (!d.is_number_integer()) return DataLoss("shape of " + en.key + " has a non-integer");
      en.shape.push_back(d.get<int64_t>());
    }
    auto vol = CheckedVolume(en.shape, static_cast<int64_t>(DTypeSize(en.dtype)));
    if (!vol.ok()) return DataLoss(vol.status().message());
    en.bytes = static_cast<uint64_t>(*vol) * DTypeSize(en.dtype);
    if (t.contains("xxh64")) {
      en.xxh64 = JsonValueOr(t, "xxh64", std::string());
      bool hex = en.xxh64.size() == 16;
      for (char c : en.xxh64) hex = hex && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
      if (!hex) return DataLoss("xxh64 of " + en.key + " is not 16 lowercase hex digits");
    }
    out.tensors.push_back(std::move(en));
  }
  return out;
}

}  // namespace tenplex::store
