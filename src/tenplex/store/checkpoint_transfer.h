// Checkpoint directories (spec §7) in and out of a store.
//
// Load: the directory's tenplex.json is read, the model and config give the layout,
// every rank file is opened and checked against it (with the recorded xxh64
// checksums verified), and all tensors of every rank file become a new version of
// the job, committed only when everything arrived. Save: the job's current version
// (resolved once, so a concurrent commit cannot mix versions) is written through
// io::CheckpointWriter: staging directory, rank files, tenplex.json with checksums
// last, rename into place.
//
// The version's info records what a byte-identical save needs:
//   {"model": <model JSON>, "config": "tp=..", "extra": {<other tenplex.json
//    fields>}, "safetensors": {"rank-00000.safetensors": {"metadata": {...},
//    "order": [...]}}}
// where a file's entry appears only when it has __metadata__ or its tensors are not
// in the default order (the layout's order, then other names sorted).
#pragma once

#include <cstdint>
#include <string>

#include "tenplex/store/client.h"

namespace tenplex::store {

struct TransferStats {
  uint64_t version = 0;
  uint64_t bytes = 0;
  std::size_t tensors = 0;
  int ranks = 0;
  bool shm = false;       // bytes went through shared memory
  bool verified = false;  // checksums were recorded and matched (load)
  double seconds = 0;
};

Result<TransferStats> LoadCheckpoint(Client& client, const std::string& job, const std::string& dir);
Result<TransferStats> SaveCheckpoint(Client& client, const std::string& job, const std::string& out);

}  // namespace tenplex::store
