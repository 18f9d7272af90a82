// The manifest of a committed version in the store's shared-memory directory
// (jobs/<job>/<v>/MANIFEST.json), read when a daemon restarts:
//   {"format": "tenplex.store.version.v1", "job": "j", "version": 3, "info": {...},
//    "tensors": [{"key": "rank-00000/name", "dtype": "F32", "shape": [2, 3],
//                 "xxh64": "0123456789abcdef"}, ...]}
// ParseManifest checks everything a restarted store relies on (format, every key a
// valid rank/name path, known dtypes, overflow-checked shapes) and never touches files;
// the caller checks each tensor file's size against `bytes`. Fuzzed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/geometry/dtype.h"
#include "tenplex/util/status.h"

namespace tenplex::store {

inline constexpr char kManifestFormat[] = "tenplex.store.version.v1";

struct ManifestTensor {
  std::string key;  // "rank-00000/name"
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;
  std::string xxh64;  // 16 lowercase hex digits; "" in manifests of older builds
};

struct Manifest {
  std::string info = "{}";  // the version's info JSON
  std::vector<ManifestTensor> tensors;
};

// `job` and `version` name the directory the manifest was found in (its keys must
// form valid paths there). DataLoss naming the problem otherwise.
Result<Manifest> ParseManifest(std::string_view text, std::string_view job,
                               std::string_view version);

}  // namespace tenplex::store
