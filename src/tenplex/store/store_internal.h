// Internal to the store (not a public header): the in-memory state of a Store and the
// helpers its implementation files share.
//   store.cc          versions and tensors (the public methods)
//   store_open.cc     opening a directory (lock, restore after a restart) and closing
//   store_create.cc   creating tensors beside the old ones and publishing them by rename
//
// Thread-safety: Impl::mu guards `jobs` and `used`; methods marked REQUIRES: mu held
// must be called with it held. Bulk file work (filling, hashing, removing trash) runs
// without it.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tenplex/store/manifest.h"
#include "tenplex/store/parse.h"
#include "tenplex/store/store.h"
#include "tenplex/util/format.h"
#include "tenplex/util/json_depth.h"

namespace tenplex::store {

namespace fs = std::filesystem;
using nlohmann::json;

inline constexpr char kManifest[] = "MANIFEST.json";
inline constexpr char kCurrent[] = "CURRENT";
// Marks a prepared version's directory (its MANIFEST.json is already written): kept
// across a restart, above the current version, until committed or aborted.
inline constexpr char kPrepared[] = "PREPARED";
// The job's incarnation on this store (store.h, JobInfo::incarnation): 16 hex digits,
// made when the job directory is created (or at open, for a directory without one).
inline constexpr char kIncarnation[] = "INCARNATION";
// The highest version whose transform is over here (JobInfo::closed): a number.
inline constexpr char kClosed[] = "CLOSED";

struct Entry {
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;
  // xxh64 of the bytes (16 hex digits): computed when the version is prepared or
  // committed, kept in its MANIFEST.json, checked by Checksum (/v1/meta) and by
  // clients reading the tensor (Client::Read); "" for open versions.
  std::string xxh64;
  uint64_t gen = 0;  // which file: a replaced tensor of an open version gets a new one
  // The writable map the store made when it created the file (null for files restored
  // after a restart or created by Put): Get and checksums read through it, and it goes
  // to the page pool with the file, so a recycled file needs no new page tables.
  std::shared_ptr<ShmMapping> map;
};

// A released tensor file kept for a new tensor of the same job (store.h, page pool).
struct PoolEntry {
  std::string file;  // <dir>/pool/<n>
  uint64_t bytes = 0;
  uint64_t seq = 0;                 // eviction order: oldest first
  std::shared_ptr<ShmMapping> map;  // may be null
  // Made by FillPool and never handed out: every byte is still the file system's zero,
  // so recycling it needs no zeroing (a released version's file always does).
  bool clean = false;
};

struct VersionState {
  bool committed = false;
  bool prepared = false;  // durable (manifest + PREPARED marker), immutable, not yet committed
  std::string info = "{}";
  std::map<std::string, Entry> tensors;  // key "rank-00000/name"
  uint64_t bytes = 0;
  std::set<int> rank_dirs;  // ranks whose directory exists in the version's directory
};

struct JobState {
  std::optional<uint64_t> current;
  uint64_t last = 0;  // highest version number the job has had
  std::map<uint64_t, VersionState> versions;
  // Fencing (store.h, BeginVersion): open version -> the newer version whose begin
  // superseded it. In memory only (open versions do not survive a restart either);
  // kept after the version is dropped so that its coordinator hears why.
  std::map<uint64_t, uint64_t> superseded;
  std::string incarnation;  // <job dir>/INCARNATION ("" until the directory is made)
  uint64_t closed = 0;      // <job dir>/CLOSED (0 when the file is absent)
  // The job directory's identity when the store made or restored it (0: not yet): a
  // directory swapped in later, or a link, is refused (Store::Impl::CheckJobDir).
  dev_t dir_dev = 0;
  ino_t dir_ino = 0;
};

// The error of every step of a superseded version's coordinator.
inline Status SupersededError(const std::string& job, uint64_t v, uint64_t by) {
  return FailedPrecondition("version " + std::to_string(v) + " of job '" + job +
                            "' was superseded by version " + std::to_string(by) +
                            " begun by another coordinator; it can never be committed (the job "
                            "goes on from the newer version; abort this one)");
}

struct PendingTensor;  // a tensor of a Create, before it is published (store_create.cc)

inline Result<std::string> CanonicalInfo(const std::string& info) {
  if (info.empty()) return std::string("{}");
  TP_RETURN_IF_ERROR(CheckJsonDepth(info, "version info"));
  json j = json::parse(info, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("version info must be a JSON object");
  return j.dump();
}

inline Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    return ErrnoError("mkdir " + path, errno);
  return Status::Ok();
}

// Makes version directory vdir's directory of `rank` unless vs knows it exists.
inline Status MakeRankDir(const std::string& vdir, int rank, VersionState& vs) {
  if (vs.rank_dirs.count(rank)) return Status::Ok();
  TP_RETURN_IF_ERROR(MakeDir(vdir + "/" + RankSegment(rank)));
  vs.rank_dirs.insert(rank);
  return Status::Ok();
}

// Removes everything inside dir (not dir itself).
inline void ClearDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
}

// Reads <dir>/HOST_ID, or makes it (random hex) when missing, logging the new id when
// `announce` (store_open.cc).
Result<std::string> LoadHostId(const std::string& dir, bool announce);

// Removes the private directories (<root>/tenplex-<pid>-<hex>) that killed stores left
// behind; returns how many (store_open.cc says when one is abandoned).
int SweepAbandonedPrivateDirs(const std::string& root);

inline std::string VersionName(const std::string& job, uint64_t v) {
  return "version " + std::to_string(v) + " of job '" + job + "'";
}

struct QuarantinedJob {
  std::string reason;
  std::string path;  // where its files were moved
};

struct Store::Impl {
  std::string dir;
  bool owned = false;
  int lock_fd = -1;
  std::string id;
  std::string host_id;  // <dir>/HOST_ID: kept across restarts (store.h)
  JobLeases leases;
  uint64_t limit = 0;
  std::atomic<uint64_t> counter{0};

  mutable std::mutex mu;
  std::map<std::string, JobState> jobs;  // guarded by mu
  uint64_t used = 0;                     // guarded by mu; includes reservations
  // Jobs whose files could not be restored when the store opened (guarded by mu).
  std::map<std::string, QuarantinedJob> quarantined;
  // The page pool (guarded by mu): per job, pooled files by size.
  uint64_t pool_limit = 0;
  uint64_t pooled = 0;  // includes files FillPoolLocked is still making (the limit's view)
  uint64_t making = 0;  // bytes of those files: not in the pool yet, not to be taken
  std::map<std::string, std::multimap<uint64_t, PoolEntry>> pool;
  // Files to remove once mu is released (evicted from the pool): Sweep.
  std::vector<std::string> unlink_later;
  // Pre-sizing (store_pool.cc): jobs and the tensor sizes to create pool files for,
  // worked off by `presizer` (guarded by mu).
  std::deque<std::pair<std::string, std::vector<uint64_t>>> presize_queue;
  std::condition_variable presize_cv;
  bool stopping = false;
  std::thread presizer;

  std::string JobDir(const std::string& job) const { return dir + "/jobs/" + job; }
  std::string VersionDir(const std::string& job, uint64_t v) const {
    return JobDir(job) + "/" + std::to_string(v);
  }
  std::string TmpName() { return dir + "/tmp/" + std::to_string(counter.fetch_add(1)); }
  std::string PoolName() { return dir + "/pool/" + std::to_string(counter.fetch_add(1)); }

  // ---- page pool (store_pool.cc)
  // REQUIRES: mu held. Moves the files of a released immutable version into the pool
  // (those that may be recycled, see store.h), within pool_limit.
  void PoolVersion(const std::string& job, uint64_t v, VersionState& vs);
  // REQUIRES: mu held. Takes the smallest pooled file of `job` that holds `bytes`
  // (and not more than about twice), if any.
  std::optional<PoolEntry> TakePooled(const std::string& job, uint64_t bytes);
  // REQUIRES: mu held. Puts back a file TakePooled gave (an allocation refused).
  void ReturnPooled(const std::string& job, PoolEntry e);
  // REQUIRES: mu held. Evicts the oldest pooled files until pooled <= target.
  void EvictPool(uint64_t target);
  // REQUIRES: mu held. Evicts pooled files until `bytes` more fit under the memory limit
  // with the pool counted; false when they do not fit even with the pool empty.
  bool FitUnderLimit(uint64_t bytes);
  // REQUIRES: mu held. Drops every pooled file of a job.
  void DropPool(const std::string& job);
  // REQUIRES: mu NOT held. Removes the files evicted meanwhile.
  void Sweep();
  // REQUIRES: mu NOT held. After versions of `job` were released: Sweep, then tells the
  // release listeners (Store::OnRelease).
  void Released(const std::string& job);
  std::mutex listen_mu;  // held while listeners are called
  std::map<uint64_t, std::function<void(const std::string&)>> listeners;  // by listen_mu
  uint64_t next_listener = 0;                                             // by listen_mu
  // REQUIRES: mu held. Queues pre-sizing of `job`'s pool after version vs committed.
  void SchedulePresize(const std::string& job, const VersionState& vs);
  // The presizer thread's body; returns once `stopping`.
  void PresizeLoop();
  // REQUIRES: lock holds mu (released while files are made). Fills job's pool with files
  // of `sizes` until it holds their sum (Store::FillPool); with job_must_exist, stops
  // when the job is gone. Returns the first error of making a file.
  Status FillPoolLocked(std::unique_lock<std::mutex>& lock, const std::string& job,
                        const std::vector<uint64_t>& sizes, bool job_must_exist);
  uint64_t PooledFor(const std::string& job) const;
  void StopPresizer();
  // Bytes of clean pooled files recycled without zeroing (pool_clean_reused_bytes).
  std::atomic<uint64_t> clean_reused{0};

  // Moves a directory to trash/ (fast, under mu); the caller removes the returned
  // path after releasing mu.
  std::string Trash(const std::string& path) {
    std::string t = dir + "/trash/" + std::to_string(counter.fetch_add(1));
    if (::rename(path.c_str(), t.c_str()) != 0) return path;  // remove in place
    return t;
  }

  // REQUIRES: mu held.
  Result<JobState*> FindJob(const std::string& job) {
    TP_RETURN_IF_ERROR(CheckJobName(job));
    TP_RETURN_IF_ERROR(CheckNotQuarantined(job));
    auto it = jobs.find(job);
    if (it == jobs.end()) return NotFound("job '" + job + "' does not exist");
    TP_RETURN_IF_ERROR(CheckJobDir(job, it->second));
    return &it->second;
  }

  // REQUIRES: mu held. FailedPrecondition when a newer version's begin superseded the
  // open version v of job (BeginVersion).
  Status CheckNotSuperseded(const std::string& job, uint64_t v) const {
    auto j = jobs.find(job);
    if (j == jobs.end()) return Status::Ok();
    auto s = j->second.superseded.find(v);
    return s == j->second.superseded.end() ? Status::Ok() : SupersededError(job, v, s->second);
  }

  // REQUIRES: mu held. DataLoss naming the reason for a quarantined job.
  Status CheckNotQuarantined(const std::string& job) const {
    auto q = quarantined.find(job);
    if (q == quarantined.end()) return Status::Ok();
    return DataLoss("job '" + job + "' is quarantined: its files could not be restored when " +
                    "the store opened (" + q->second.reason + "); they were moved to " +
                    q->second.path + ". Remove the job (tenplex store rm " + job +
                    ") to reuse the name");
  }

  // REQUIRES: mu held. Resolves "current" (nullopt) to the current version.
  Result<std::pair<uint64_t, VersionState*>> FindVersion(const std::string& job, VersionRef ref) {
    TP_ASSIGN_OR_RETURN(JobState * j, FindJob(job));
    if (!ref) {
      if (!j->current) return NotFound("job '" + job + "' has no committed version");
      ref = j->current;
    }
    auto it = j->versions.find(*ref);
    if (it == j->versions.end()) {
      std::string have;
      for (const auto& [v, s] : j->versions) {
        have += (have.empty() ? "" : ", ") + std::to_string(v) +
                (j->current == v ? " (current)"
                 : s.committed   ? " (committed)"
                                 : " (open)");
      }
      return NotFound(VersionName(job, *ref) +
                      " does not exist (versions: " + (have.empty() ? "none" : have) + ")");
    }
    return std::make_pair(*ref, &it->second);
  }

  // REQUIRES: mu held.
  Result<std::pair<uint64_t, VersionState*>> FindOpenVersion(const TensorPath& p) {
    if (!p.version) {
      return FailedPrecondition(
          "jobs/" + p.job +
          "/current is a committed version and immutable; write into an open version");
    }
    TP_ASSIGN_OR_RETURN(auto v, FindVersion(p.job, p.version));
    if (v.second->committed) {
      return FailedPrecondition(VersionName(p.job, v.first) + " is committed and immutable");
    }
    if (v.second->prepared) {
      return FailedPrecondition(VersionName(p.job, v.first) +
                                " is prepared (phase one of a commit) and immutable");
    }
    TP_RETURN_IF_ERROR(CheckNotSuperseded(p.job, v.first));
    return v;
  }

  // REQUIRES: mu held.
  Result<std::pair<TensorInfo, Entry*>> FindTensor(const std::string& path) {
    TP_ASSIGN_OR_RETURN(TensorPath p, ParseTensorPath(path));
    TP_ASSIGN_OR_RETURN(auto v, FindVersion(p.job, p.version));
    auto it = v.second->tensors.find(p.Key());
    if (it == v.second->tensors.end()) {
      return NotFound("tensor '" + p.WithVersion(v.first) + "' does not exist");
    }
    return std::make_pair(MakeInfo(p.job, v.first, *v.second, it->first, it->second), &it->second);
  }

  TensorInfo MakeInfo(const std::string& job, uint64_t v, const VersionState& vs,
                      const std::string& key, const Entry& e) const {
    TensorInfo info;
    info.path = VersionPrefix(job, v) + key;
    info.dtype = e.dtype;
    info.shape = e.shape;
    info.bytes = e.bytes;
    info.committed = vs.committed;
    info.file = VersionDir(job, v) + "/" + key;
    info.xxh64 = e.xxh64;
    return info;
  }

  // REQUIRES: mu held. Removes a version from memory; returns its directory (moved to
  // trash) for removal after mu is released.
  std::string EraseVersion(const std::string& job, JobState& j, uint64_t v) {
    auto it = j.versions.find(v);
    used -= it->second.bytes;
    if (it->second.committed || it->second.prepared) PoolVersion(job, v, it->second);
    j.versions.erase(it);
    return Trash(VersionDir(job, v));
  }

  // REQUIRES: mu held. The MANIFEST.json text of a version (written at prepare and at
  // commit).
  std::string ManifestText(const std::string& job, uint64_t v, const VersionState& vs) const {
    json m;
    m["format"] = kManifestFormat;
    m["job"] = job;
    m["version"] = v;
    m["info"] = json::parse(vs.info);
    json ts = json::array();
    for (const auto& [key, e] : vs.tensors) {
      json t = {
          {"key", key}, {"dtype", DTypeName(e.dtype)}, {"shape", e.shape}, {"bytes", e.bytes}};
      if (!e.xxh64.empty()) t["xxh64"] = e.xxh64;
      ts.push_back(std::move(t));
    }
    m["tensors"] = std::move(ts);
    return m.dump(1) + "\n";
  }

  // REQUIRES: mu held. Ok when the job's directory is still the real directory the
  // store made or restored (its device and inode; recorded on the first call), else
  // DataLoss saying what replaced it (a symbolic link, another directory, nothing): the
  // store never follows a job directory swapped behind its back (issue 35).
  Status CheckJobDir(const std::string& job, JobState& j) const;
  // REQUIRES: mu held; the job directory exists. Gives the job an incarnation (written
  // to its INCARNATION file) unless it has one.
  Status EnsureIncarnation(const std::string& job, JobState& j);
  // REQUIRES: mu held. Raises the job's closed mark to `version` (written to CLOSED).
  Status RaiseClosed(const std::string& job, JobState& j, uint64_t version);
  Status Restore();
  Status RestoreJob(const std::string& job);
  // The incarnation and closed mark in an existing job directory (RestoreJob).
  Status RestoreJobIdentity(const std::string& job, JobState& js);
  Status Quarantine(const std::string& job, const Status& why);
  // Computes the xxh64 of every tensor of an open version that has none yet (in
  // parallel, without mu held), before Prepare/Commit write the manifest.
  Status RecordChecksums(const std::string& job, uint64_t version);
  void ListQuarantine();
  // Creates tensors beside the old ones and publishes them by rename. With `fill`
  // (one tensor), its bytes come from the callback through a sparse file's pwrite;
  // without, the files are allocated zero-filled and mapped writable into `maps`.
  using Fill = std::function<Status(TensorSink&)>;
  Result<std::vector<TensorInfo>> Create(const std::vector<AllocRequest>& reqs, const Fill* fill,
                                         std::vector<std::shared_ptr<ShmMapping>>* maps,
                                         bool zero_fill = true);
  // Create's steps: reserves `total` bytes against the limit once every tensor's version
  // is open and no tensor is asked for twice; then renames the written files into their
  // versions (undoing the reservation of those not published).
  Status ReserveForCreate(std::vector<PendingTensor>& pend, uint64_t total);
  Result<std::vector<TensorInfo>> PublishCreated(const std::vector<AllocRequest>& reqs,
                                                 const std::vector<PendingTensor>& pend,
                                                 uint64_t total,
                                                 std::vector<std::shared_ptr<ShmMapping>>* maps);
};

}  // namespace tenplex::store
