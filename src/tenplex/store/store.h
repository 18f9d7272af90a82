// The tensor store: a job's state held outside its training processes, in shared
// memory owned by the store, organised in versions (docs/store.md).
//
// Paths are jobs/{job}/{version}/rank-{r:05d}/{name} (parse.h). A version is *open*
// while it is being built (tensors may be allocated, overwritten and deleted) and
// *committed* once Commit() made it the job's current version; committed versions
// are immutable. jobs/{job}/current/... resolves to the current version. A new version
// is built beside the current one and committed atomically; Commit releases the older
// versions unless asked to keep them (ReleaseOld / DropVersion release them later).
//
// Every tensor is one file of the shared-memory directory (mapping.h), so a local
// process maps it directly (TensorInfo::file) and the bytes survive the crash of the
// process that wrote them. On disk:
//   <dir>/LOCK                   flock: one store per directory
//   <dir>/STORE_ID               random id of this store instance (local-client check)
//   <dir>/HOST_ID                the stable host id: made once, kept across restarts
//   <dir>/tmp/                   tensors being created, renamed into place when ready
//   <dir>/jobs/<job>/CURRENT     the committed version number, replaced by rename
//   <dir>/jobs/<job>/INCARNATION the job's incarnation on this store (JobInfo)
//   <dir>/jobs/<job>/CLOSED      the highest version whose transform is over (JobInfo)
//   <dir>/jobs/<job>/<v>/MANIFEST.json          written at commit, before CURRENT
//   <dir>/jobs/<job>/<v>/rank-NNNNN/<name>      the tensor bytes
//   <dir>/jobs/<job>/<v>/PREPARED               written at Prepare, after the manifest
//   <dir>/quarantine/<job>[.N], <job>[.N].why   a job that could not be restored
// The commit point is the rename of CURRENT. Opening an existing directory keeps the
// current version (and older committed versions that were kept) and the prepared
// versions above it (a two-phase commit across hosts decides their fate: transform/
// two_phase.h), and removes anything else: open versions and half-finished commits of
// a crashed store.
//
// Memory accounting: the bytes of all tensor files count against memory_limit;
// an allocation that would exceed it is ResourceExhausted, naming the numbers.
//
// Page pool: on this kind of machine the first write into new shared memory costs
// 10-100x a warm memcpy (page allocation, zeroing, page-table set-up through a new
// map). So the files of a released committed or prepared version are not removed but
// moved to <dir>/pool/ (with the writable map the store made when it created them) and
// recycled for new tensors of the same job: a pooled file at least as large (and at
// most about twice) is renamed into place, truncated to size, and zeroed through its
// already-populated map (Allocate) or overwritten completely (Put), so no byte of an
// older tensor is ever visible in a new one, and no job ever gets another's pages.
// The pool is bounded (page_pool_bytes, oldest files removed first); pooled bytes
// count against memory_limit and are evicted before any allocation is refused. The pool
// is never state: Open clears <dir>/pool/. Files shared with another version (Link),
// still mapped by a TensorRef/TensorWriter of this process, or of open versions (whose
// writers may be in other processes) are never pooled. REQUIRES of local processes that
// map tensor files: no reads through a map of a version after it was released (the
// pages may hold another tensor by then).
//
// Thread-safety: all methods may be called from many threads at once. The metadata
// is guarded by one mutex that is never held during bulk copies or hashing. Writers
// and readers hold their maps by shared ownership: a TensorRef stays readable after
// its tensor is deleted or its version released (the memory is freed when the last
// map goes). REQUIRES of callers: no writes through a TensorWriter (or a local map of
// an open tensor) after its version is committed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/geometry/box.h"
#include "tenplex/geometry/dtype.h"
#include "tenplex/store/lease.h"
#include "tenplex/store/mapping.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/status.h"

namespace tenplex::store {

// Tensor files smaller than this are never pooled (cheap to create anew).
inline constexpr uint64_t kPoolMinBytes = 256 << 10;

struct StoreOptions {
  // Where the shared memory lives. Empty: a fresh private directory
  // /dev/shm/tenplex-<pid>-<random> that the store removes when destroyed. Given: the
  // directory is created if needed and committed state is kept across restarts.
  std::string shm_dir;
  // Bytes of tensors the store may hold; 0 means the free space of the shared-memory
  // file system when the store opens.
  uint64_t memory_limit = 0;
  // Most bytes of released tensor files kept for recycling (the page pool above);
  // nullopt: a quarter of the memory limit; 0 turns the pool off.
  std::optional<uint64_t> page_pool_bytes = std::nullopt;
  // Pre-size the next version: after each commit a background thread fills the job's
  // pool with files of the committed version's tensor sizes (pages allocated and mapped,
  // as far as the pool bound and the memory limit leave room, never evicting), so that
  // the next version (a transform, a checkpoint) writes into warm pages.
  bool presize_pool = false;
};

struct TensorInfo {
  std::string path;  // full path with the version number
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;
  bool committed = false;
  std::string file;  // the shared-memory file holding the bytes at offset 0
  // xxh64 of the bytes recorded when its version was prepared or committed (16 hex
  // digits; "" for an open version). A reader compares it with what it read.
  std::string xxh64;
};

// Read-only access to a tensor's bytes.
class TensorRef {
 public:
  const TensorInfo& info() const { return info_; }
  const uint8_t* data() const { return map_ ? map_->data() : nullptr; }
  uint64_t size() const { return info_.bytes; }
  // Fills the page tables of the map now (ShmMapping::Prefault): on machines where a
  // page fault is expensive, a bulk copy then runs at memory speed.
  void Prefault() const {
    if (map_) map_->Prefault();
  }

 private:
  friend class Store;
  TensorInfo info_;
  std::shared_ptr<const ShmMapping> map_;
};

// Writable access to a tensor of an open version (zero-filled when allocated).
class TensorWriter {
 public:
  const TensorInfo& info() const { return info_; }
  uint8_t* data() const { return map_ ? map_->data() : nullptr; }
  uint64_t size() const { return info_.bytes; }
  void Prefault() const {
    if (map_) map_->Prefault();
  }

 private:
  friend class Store;
  TensorInfo info_;
  std::shared_ptr<ShmMapping> map_;
};

struct VersionInfo {
  std::string job;
  uint64_t version = 0;
  bool committed = false;
  bool prepared = false;  // phase one of a two-phase commit done (durable, not yet current)
  bool current = false;
  uint64_t bytes = 0;
  std::size_t tensors = 0;
  std::string info = "{}";  // JSON object attached by the writer (model, config, ...)
  std::string info_xxh64;   // Client::JobDigests only: the info's xxh64 (info left empty)
};

struct JobInfo {
  std::string job;
  std::optional<uint64_t> current;
  // The highest version number the job has had on this daemon since it started (aborted
  // and dropped ones included; after a restart: the highest one on disk). A coordinator
  // picks its next number above it, so that a number is never reused for other content.
  uint64_t last = 0;
  std::vector<VersionInfo> versions;  // increasing
  // The job's incarnation on this store: 16 random hex digits made when the job is
  // created here (kept in <job dir>/INCARNATION across restarts; a directory of an older
  // build gets one at open). Deleting the job and creating it again gives a new one, and
  // another store's copy of the job has its own. Data-plane capabilities name it
  // (transport/capability.h), so one minted for a job does not read its re-creation.
  std::string incarnation;
  // The highest version whose transform is over on this store (CloseTransforms, or an
  // uncommitted version dropped here), kept in <job dir>/CLOSED; 0: none. The transform
  // agent refuses capabilities of transforms to it or an older version.
  uint64_t closed = 0;
};

class Store {
 public:
  static Result<std::unique_ptr<Store>> Open(const StoreOptions& options = {});
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& shm_dir() const;
  // Random id written to <shm_dir>/STORE_ID: a client that reads the same id from the
  // file system shares this store's memory.
  const std::string& id() const;
  // The stable identity of this host's store: random hex made once and kept in
  // <shm_dir>/HOST_ID, so a restart on the same directory keeps it (id() changes).
  // Components match hosts by it, never by the URL a host is reached by (a job's
  // recorded placement, cluster/cluster_state.h). Not the machine's boot id
  // (transport::HostBootId, the control protocol's "local.host_id").
  const std::string& host_id() const;
  // The coordinator leases of this daemon's jobs (lease.h); in memory, not kept across
  // a restart.
  JobLeases& leases();
  uint64_t used_bytes() const;
  uint64_t memory_limit() const;
  // Bytes of released tensor files kept in the page pool (counted against the memory
  // limit besides used_bytes) and the pool's bound. Files still being pre-sized are
  // counted against the limit but not here: pool_bytes() is what new tensors can take.
  uint64_t pool_bytes() const;
  uint64_t page_pool_limit() const;
  // Bytes of pre-sized pool files (FillPool, presize_pool) that new tensors took while
  // still clean (never written), and so without zeroing them again; since Open.
  uint64_t pool_clean_reused_bytes() const;
  // Pre-sizes the pool for a version that is about to be written here (a transform
  // planned onto this host, which may not hold the job yet): makes files of these sizes
  // (pages allocated and mapped) for `job` until its pool holds sum(sizes) bytes, as far
  // as the pool bound and the memory limit leave room, never evicting; sizes below the
  // pool's minimum are skipped. Runs on the calling thread. Returns the job's pooled
  // bytes afterwards; FailedPrecondition when the pool is off, the file system's error
  // when a file cannot be made.
  Result<uint64_t> FillPool(const std::string& job, const std::vector<uint64_t>& sizes);
  // Counts `bytes` of memory that is not a tensor (a bandwidth probe's buffers) against
  // the memory limit until the returned handle is destroyed; ResourceExhausted, naming
  // `what`, when it does not fit. REQUIRES: the handle does not outlive the store.
  Result<std::shared_ptr<void>> Reserve(uint64_t bytes, const std::string& what);
  // Calls `listener(job)` after versions of `job` were released (Commit, DropVersion,
  // ReleaseOld, DeleteJob), on the releasing thread with no store lock held. A holder
  // of maps of committed tensors (the transform agent's cache of tensors its peers read)
  // drops those of released versions then: a released tensor's memory is freed only
  // when its last map goes, and the holder would otherwise keep it until it next looks.
  // Listening stops when the returned handle is destroyed (which waits for a call in
  // progress). REQUIRES: the handle does not outlive the store; a listener does not
  // call OnRelease.
  std::shared_ptr<void> OnRelease(std::function<void(const std::string& job)> listener);

  // ---- versions
  // Opens a new version of job (created on first use). Without `version` it is one
  // more than any version the job has had; an explicit one must be greater than the
  // current version and not exist yet (hosts of a job agree on a number this way).
  // `info` is a JSON object kept with the version ("" = {}).
  // Fencing (cluster/two_phase.h): beginning v supersedes every open version below
  // it (their coordinators lost the race: writing into them, Prepare and Commit fail
  // with "superseded by version v begun by another coordinator", until v is aborted
  // here: DropVersion of an uncommitted v lifts what it superseded); v is refused while
  // an uncommitted version above it exists (v's coordinator is the one that lost) or a
  // prepared one below it awaits its decision (a prepared version is never superseded:
  // its coordinator may have decided to commit it).
  // With `made_from` (the version the new one is computed from, e.g. a transform's
  // source), refused when a version newer than it was committed here meanwhile (its
  // result would silently replace that one's).
  Result<uint64_t> BeginVersion(const std::string& job, std::optional<uint64_t> version = {},
                                const std::string& info = "",
                                std::optional<uint64_t> made_from = std::nullopt);
  // Replaces the info of an open version.
  Status SetVersionInfo(const std::string& job, uint64_t version, const std::string& info);
  // Phase one of a two-phase commit across stores: the open version becomes immutable
  // and durable (its manifest and a PREPARED marker are written), so that a restart
  // keeps it (prepared, above the current version) instead of discarding it. Only
  // Commit or DropVersion end it. Idempotent.
  Status Prepare(const std::string& job, uint64_t version);
  // Makes an open or prepared version the current one (atomically, see above). It must
  // be newer than the current version; committing the current version again is a no-op
  // (a coordinator that lost a reply asks again). Unless keep_old, every older version
  // of the job (open, prepared or committed) is released.
  Status Commit(const std::string& job, uint64_t version, bool keep_old = false);
  // Removes an open version, or releases a committed version that is not current.
  // Dropping an uncommitted version (an abort) also closes its transform here (below).
  Status DropVersion(const std::string& job, uint64_t version);
  // Marks the transforms of job to `version` and older as over on this store (a
  // coordinator tells every host of a transform once it committed or aborted it,
  // cluster/revocation.h): JobInfo::closed rises to `version` (never falls), durably.
  // NotFound when the job does not exist here.
  Status CloseTransforms(const std::string& job, uint64_t version);
  // Releases the committed versions older than the current one.
  Status ReleaseOld(const std::string& job);
  // Removes a job with all its versions (a quarantined job: its moved-aside files).
  Status DeleteJob(const std::string& job);
  // Jobs whose files could not be restored when the store opened (a corrupt or
  // truncated manifest, a missing tensor file): moved aside to <dir>/quarantine/, not
  // served (every access is DataLoss naming the reason) until DeleteJob.
  struct Quarantined {
    std::string job, reason, path;
  };
  std::vector<Quarantined> QuarantinedJobs() const;
  std::vector<std::string> Jobs() const;
  Result<JobInfo> Job(const std::string& job) const;
  // version nullopt: the current version.
  Result<VersionInfo> Version(const std::string& job, VersionRef version) const;

  // ---- tensors (paths as in parse.h; "current" resolves to the current version)
  // Creates (or replaces) a zero-filled tensor in an open version and maps it
  // writable. The tensor is visible as soon as this returns.
  Result<TensorWriter> Allocate(const std::string& path, DType dtype, const Shape& shape);
  // Creates (or replaces) a tensor with the given bytes; `size` must equal
  // dtype size x volume. The tensor becomes visible only when fully written.
  Result<TensorInfo> Put(const std::string& path, DType dtype, const Shape& shape, const void* data,
                         uint64_t size);
  // The same with the bytes streamed in by `fill` (an HTTP body): it must write
  // exactly dtype size x volume bytes through the sink, else nothing is created.
  Result<TensorInfo> PutFrom(const std::string& path, DType dtype, const Shape& shape,
                             const std::function<Status(TensorSink&)>& fill);
  // Several tensors created at once (for local processes that map or pwrite their
  // files): all succeed or none is created. Their pages are always allocated (and
  // zeroed) now, so a full file system is ResourceExhausted here and a map of them never
  // gets SIGBUS. zero_fill false: the caller writes every byte before the commit, so a
  // file recycled from the job's pool is not zeroed (it holds an older tensor of the
  // same job until then); fresh files are zeros either way.
  struct AllocRequest {
    std::string path;
    DType dtype = DType::kF32;
    Shape shape;
  };
  Result<std::vector<TensorInfo>> AllocateMany(const std::vector<AllocRequest>& requests,
                                               bool zero_fill = true);
  // Makes `to` (in an open version) a second name of the committed tensor `from`: the
  // same shared-memory pages, no copy (a hard link of its file). A transform uses it
  // for tensors that stay exactly where they are. Committed tensors are immutable and
  // `to` must never be written either (REQUIRES of callers); releasing `from`'s
  // version leaves `to` intact. Counted against the memory limit like a new tensor
  // until `from` is released.
  Result<TensorInfo> Link(const std::string& from, const std::string& to);
  Result<TensorRef> Get(const std::string& path) const;
  Result<TensorInfo> Meta(const std::string& path) const;
  // xxh64 of the tensor's bytes as 16 hex digits, computed now; for a prepared or
  // committed tensor, DataLoss when it differs from the checksum recorded in the
  // version's manifest (its shared-memory file was written behind the store's back).
  Result<std::string> Checksum(const std::string& path) const;
  // Removes a tensor of an open version.
  Status Delete(const std::string& path);
  // Tensors whose full path (with "current" resolved) starts with the prefix
  // (parse.h ListPrefix), sorted by job, version number, rank and name.
  Result<std::vector<TensorInfo>> List(const std::string& prefix) const;

 private:
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tenplex::store
