// Checkpoint directories (spec §7): `tenplex.json` ({"model": <model JSON>,
// "config": "<config>", ...}) and one safetensors file per rank,
// `rank-00000.safetensors`, holding the rank's local tensors under their local names,
// padding zeroed.
//
// Writing is atomic at the directory level: files go into a staging directory beside
// the target (`<dir>.partial-<pid>-<n>`), each written to a temporary name, fsynced and
// renamed; `tenplex.json` is written last, with the xxh64 of every rank file, and the
// staging directory is then renamed onto the target. A failed or abandoned write
// removes the staging directory, so no partial output is left behind. The staging
// directory records its writer (host, pid, process start time, `.tenplex-writer`);
// Create removes the staging directories of writers of this host that died (a SIGKILL
// leaves no destructor to run) from the directory it writes into.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tenplex/io/safetensors.h"
#include "tenplex/model/model.h"
#include "tenplex/ptc/config.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::io {

inline constexpr char kCheckpointInfoFile[] = "tenplex.json";

// "rank-00007.safetensors"
std::string RankFileName(int rank);

struct CheckpointInfo {
  Model model;
  ParallelConfig config;
  nlohmann::json extra = nlohmann::json::object();  // other fields of tenplex.json (step, ...)
  std::map<std::string, std::string> checksums;     // file name -> xxh64 (16 hex digits)
  bool checksums_recorded = false;                  // tenplex.json has "checksums"
};

// Reads and type-checks tenplex.json: a regular file (no symbolic link or FIFO), a JSON
// object with "model" and "config"; "checksums", when present, must be an object of
// file name -> 16 lowercase hex digits (anything else is DataLoss, never ignored).
Result<CheckpointInfo> ReadCheckpointInfo(const std::string& dir);

// The spec (§7) makes "checksums" optional; our commands require them by default
// (docs/reliability.md): DataLoss unless tenplex.json records one for every rank file
// of its config and none for anything else.
Status RequireChecksums(const CheckpointInfo& info, const std::string& dir);

// Opens every rank file of the directory and checks it against `layout`: all files
// present and regular (util/file.h OpenRegularFile), every local tensor present with
// the layout's dtype and shape. With verify_checksums, checksums are required
// (RequireChecksums) and every file is hashed and compared (VerifyChecksums).
Result<std::vector<SafetensorsFile>> OpenCheckpoint(const std::string& dir, const Layout& layout,
                                                    const CheckpointInfo& info,
                                                    bool verify_checksums = false,
                                                    ThreadPool* pool = nullptr);

// RequireChecksums, then the xxh64 of every opened file (from its mapping, in parallel
// on `pool`) against the recorded one: DataLoss naming the first file that differs.
Status VerifyChecksums(const std::vector<SafetensorsFile>& files, const CheckpointInfo& info,
                       const std::string& dir, ThreadPool* pool = nullptr);

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
  // Writes tenplex.json last (with the xxh64 of each rank file when `checksums`; else
  // info.extra must carry "checksums", computed by the caller) and moves the directory
  // into place.
  Status Commit(const CheckpointInfo& info, bool checksums = true);

 private:
  CheckpointWriter() = default;
  std::string dir_, staging_;
  bool committed_ = true;
};

}  // namespace tenplex::io
