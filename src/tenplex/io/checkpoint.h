// Checkpoint directories (spec §7): `tenplex.json` ({"model": <model JSON>,
// "config": "<config>", ...}) and one safetensors file per rank,
// `rank-00000.safetensors`, holding the rank's local tensors under their local names,
// padding zeroed.
//
// Writing is atomic at the directory level: files go into a staging directory beside
// the target (`<dir>.partial-<pid>-<n>`), each written to a temporary name, fsynced and
// renamed; `tenplex.json` is written last, with the xxh64 of every rank file, and the
// staging directory is then renamed onto the target. A failed or abandoned write
// removes the staging directory, so no partial output is left behind.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tenplex/io/safetensors.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/ptc/layout.h"

namespace tenplex::io {

inline constexpr char kCheckpointInfoFile[] = "tenplex.json";

// "rank-00007.safetensors"
std::string RankFileName(int rank);

struct CheckpointInfo {
  Model model;
  ParallelConfig config;
  nlohmann::json extra = nlohmann::json::object();  // other fields of tenplex.json (step, ...)
  std::map<std::string, std::string> checksums;     // file name -> xxh64 hex ("" when absent)
};

Result<CheckpointInfo> ReadCheckpointInfo(const std::string& dir);

// Opens every rank file of the directory and checks it against `layout`: all files
// present, every local tensor present with the layout's dtype and shape. With
// verify_checksums, files whose checksum is recorded are hashed and compared.
Result<std::vector<SafetensorsFile>> OpenCheckpoint(const std::string& dir, const Layout& layout,
                                                    const CheckpointInfo& info,
                                                    bool verify_checksums = false);

// xxh64 of a whole file, as 16 hex digits.
Result<std::string> FileXxh64(const std::string& path);

class CheckpointWriter {
 public:
  // Fails when dir exists and is not empty (never overwrites a checkpoint).
  static Result<CheckpointWriter> Create(const std::string& dir);
  CheckpointWriter(CheckpointWriter&&) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&&) = delete;
  ~CheckpointWriter();

  // Where to write a rank file (inside the staging directory).
  std::string RankPath(int rank) const;
  const std::string& staging_dir() const { return staging_; }
  // Writes tenplex.json last (with the xxh64 of each rank file when `checksums`) and
  // moves the directory into place.
  Status Commit(const CheckpointInfo& info, bool checksums = true);

 private:
  CheckpointWriter() = default;
  std::string dir_, staging_;
  bool committed_ = true;
};

}  // namespace tenplex::io
