// A C++ client of the store daemon (docs/store.md). Control calls go over HTTP;
// bulk bytes go through shared memory when the daemon is on this machine (the
// client reads the daemon's STORE_ID file from the daemon's shm directory to know),
// and through HTTP bodies otherwise.
//
// Local zero-copy: Allocate() creates tensors and returns their shared-memory files;
// Map() maps a tensor's file (writable for an open version) so a process works on the
// store's memory directly. Write()/Read() copy a buffer into or out of a tensor with
// pwrite/pread on its file (parallel chunks), which needs no page-table set-up in this
// process and is the fastest one-shot copy.
//
// Thread-safety: calls are serialised by a mutex; use one Client per thread for
// parallel HTTP transfers.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/store/mapping.h"
#include "tenplex/store/store.h"
#include "tenplex/util/status.h"

namespace tenplex::store {

struct ClientOptions {
  std::string token;    // sent as "Authorization: Bearer <token>" when not empty
  bool use_shm = true;  // false: always HTTP bodies (tests the remote path locally)
  int timeout_s = 600;  // read/write timeout of one request
  // The coordinator every request names (lease.h, X-Tenplex-Coordinator); "" for none.
  std::string coordinator = {};
};

class Client {
 public:
  // Connects to "http://host:port" and asks /v1/health who the store is.
  static Result<std::unique_ptr<Client>> Connect(const std::string& url,
                                                 const ClientOptions& options = {});
  ~Client();

  const std::string& url() const { return url_; }
  // True when bulk bytes go through shared memory.
  bool local() const { return local_; }
  // The daemon's process id when local() (0 otherwise or when it does not say).
  int64_t pid() const { return pid_; }
  const std::string& store_id() const { return store_id_; }
  // The daemon's stable host id (Store::host_id, from /v1/health); "" from a daemon of
  // an older build that does not say.
  const std::string& host_id() const { return host_id_; }

  // ---- coordinator leases (lease.h)
  // Names this client's coordinator on every later request (X-Tenplex-Coordinator), so
  // the daemon runs its changes of a job's versions under that coordinator's lease.
  Status SetCoordinator(const std::string& holder);
  const std::string& coordinator() const { return coordinator_; }
  // Takes or renews the job's lease for the coordinator (SetCoordinator first); Aborted
  // naming the holder when another coordinator holds it.
  Result<LeaseView> AcquireLease(const std::string& job, int64_t ttl_ms = kDefaultLeaseMs);
  Status ReleaseLease(const std::string& job);
  // The job's live lease on this daemon (holder "" when none).
  Result<LeaseView> Lease(const std::string& job);

  // ---- versions
  Result<uint64_t> BeginVersion(const std::string& job, std::optional<uint64_t> version = {},
                                const std::string& info = "");
  Status SetVersionInfo(const std::string& job, uint64_t version, const std::string& info);
  Status Commit(const std::string& job, uint64_t version, bool keep_old = false);
  // Phase one of a two-phase commit (Store::Prepare): durable across a restart.
  Status Prepare(const std::string& job, uint64_t version);
  Status Abort(const std::string& job, uint64_t version);
  Result<VersionInfo> Version(const std::string& job, VersionRef version);
  // ---- jobs (GET /v1/jobs, GET and DELETE /v1/jobs/{job}, DELETE .../versions/{v})
  Result<std::vector<std::string>> Jobs();
  Result<JobInfo> Job(const std::string& job);
  // The same with each version's info_xxh64 instead of its info (GET ?info=digest): a
  // small reply however large the infos are.
  Result<JobInfo> JobDigests(const std::string& job);
  Status DeleteJob(const std::string& job);
  // Removes an open version or releases an old committed one (not the current one).
  Status DropVersion(const std::string& job, uint64_t version);

  // ---- tensors
  // With file paths when local().
  Result<std::vector<TensorInfo>> List(const std::string& prefix);
  // Metadata plus the xxh64 of the bytes.
  Result<std::pair<TensorInfo, std::string>> Meta(const std::string& path);
  Status Delete(const std::string& path);

  // Creates the tensors (one request) and writes their bytes: through shared memory
  // when local(), else one PUT each. data[i] holds exactly the tensor's bytes.
  Status WriteMany(const std::vector<Store::AllocRequest>& tensors,
                   const std::vector<const void*>& data);
  Status Write(const std::string& path, DType dtype, const Shape& shape, const void* data,
               uint64_t size);
  // Reads a whole tensor (info from List/Meta; info.bytes bytes into dst). A tensor
  // with a recorded checksum (info.xxh64: prepared or committed) is checked against it:
  // DataLoss naming the tensor when its bytes changed after the commit.
  Status Read(const TensorInfo& info, void* dst);

  // ---- HTTP bodies (work from anywhere)
  Result<TensorInfo> Put(const std::string& path, DType dtype, const Shape& shape, const void* data,
                         uint64_t size);
  // GET with an optional range; dtype/shape of the result are returned when asked.
  Result<std::string> Get(const std::string& path, const std::string& range = "",
                          DType* dtype = nullptr, Shape* shape = nullptr);
  // GET streamed into dst, which must hold exactly `size` bytes of the result.
  Status GetInto(const std::string& path, const std::string& range, void* dst, uint64_t size);

  // ---- local shared memory (local() only)
  // zero_fill false: sparse files the caller writes completely (Write uses this).
  Result<std::vector<TensorInfo>> Allocate(const std::vector<Store::AllocRequest>& tensors,
                                           bool zero_fill = true);
  Result<TensorInfo> ShmInfo(const std::string& path);
  // A JSON request to any endpoint (e.g. one added with Server::AddJsonRoute): the reply
  // body, or the error the store sent (its code and message).
  Result<std::string> CallJson(const std::string& method, const std::string& target,
                               const std::string& body = "") {
    return Call(method, target, body);
  }

  // Maps a tensor's file; `writable` needs an open version.
  static Result<ShmMapping> Map(const TensorInfo& info, bool writable, bool populate = false);

 private:
  Client() = default;
  Result<JobInfo> GetJob(const std::string& job, bool digests);
  struct Http;
  Result<std::string> Call(const std::string& method, const std::string& target,
                           const std::string& body = "",
                           const std::string& content_type = "application/json",
                           int* status = nullptr);
  std::string url_;
  std::string store_id_;
  std::string host_id_;
  std::string coordinator_;
  bool local_ = false;
  int64_t pid_ = 0;
  std::unique_ptr<Http> http_;
  std::mutex mu_;
};

}  // namespace tenplex::store
