// Where a run keeps the job's state between segments: the tensor store embedded in
// the runner (store/store.h, shared memory under --shm-dir or a private directory),
// or the store daemons of a cluster file (rank r on host r / K, every daemon on this
// machine so that workers map its shared memory). The runner drives both the same way
// through StateBackend; tests give it an in-memory fake.
//
// Versions: BeginLayout opens one version at a time; the runner commits or drops it
// before it opens the next (a committed version releases the older ones). Transform
// turns the committed version into a new committed one in another config.
//
// Thread-safety: a backend is used by one thread (the runner's).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tenplex/io/state_info.h"
#include "tenplex/ptc/config.h"
#include "tenplex/ptc/layout.h"
#include "tenplex/runtime/runner.h"
#include "tenplex/util/status.h"

namespace tenplex::runtime {

class StateBackend {
 public:
  virtual ~StateBackend() = default;
  // Hand-off files and worker logs go here.
  virtual std::string work_dir() const = 0;
  // False when work_dir() is removed with the backend (inside a private store
  // directory): the logs of a failed run must then be kept elsewhere.
  virtual bool work_dir_kept() const { return true; }
  // The job's committed version and its info (as given to Commit), or nullopt for a job
  // without one: a run continues from it. An info that is not a valid StateInfo
  // (io/state_info.h) is FailedPrecondition naming the version.
  struct Committed {
    uint64_t version = 0;
    io::StateInfo info;
  };
  virtual Result<std::optional<Committed>> Current(const std::string& job) = 0;
  // Opens a new version laid out for `layout`, every tensor allocated (zero-filled),
  // with `info` attached. On error nothing stays open.
  virtual Result<uint64_t> BeginLayout(const std::string& job, const Layout& layout,
                                       io::StateInfo info) = 0;
  // The shared-memory file of every tensor of every rank of version v
  // ([rank][name] = file).
  virtual Result<std::vector<std::map<std::string, std::string>>> Files(const std::string& job,
                                                                        uint64_t v,
                                                                        const Layout& layout) = 0;
  // Attaches `info` to the open version v and commits it. A failed commit may have
  // committed v on some hosts already (the cluster backend: the decision was commit, and
  // the next Current() rolls it forward); Drop then leaves it alone.
  virtual Status Commit(const std::string& job, uint64_t v, const io::StateInfo& info) = 0;
  // Removes the open version v (best effort; never a version committed anywhere).
  virtual void Drop(const std::string& job, uint64_t v) = 0;
  struct Moved {
    uint64_t version = 0;
    int64_t bytes_moved = 0, bytes_total = 0, bytes_in_place = 0;
    // Payload fetched from other hosts, and the plan's cross-host lower bound (0 on one
    // host).
    int64_t bytes_cross_host = 0, cross_host_lower_bound = 0;
    // The PresizeAhead before it, if one ran: the new bytes large enough to pool, how many
    // of them the hosts' pools held afterwards, its seconds (off the transform's path)
    // and its error (best effort: the transform then allocates them itself).
    bool presized = false;
    int64_t presize_poolable_bytes = 0, presize_pooled_bytes = 0;
    double presize_seconds = 0;
    std::string presize_error = {};
  };
  // Transforms the committed version to `to`, committed (after waiting for a
  // PresizeAhead still running).
  virtual Result<Moved> Transform(const std::string& job, const ParallelConfig& to) = 0;
  // Starts making, in the background, the new tensors a Transform of the committed
  // version to `to` will allocate, so that it finds them ready (the cluster backend:
  // every host with new ranks fills its page pool, POST /v1/transform/presize; a host
  // that joins holds nothing of the job, so it has nothing else to recycle). Called while
  // the current config still trains; never writes or commits anything. Default: nothing.
  virtual void PresizeAhead(const std::string& job, const ParallelConfig& to) {
    (void)job;
    (void)to;
  }
  // Host failures (kill_hosts; the cluster backend only): CheckHosts says whether the
  // indexes name hosts of the cluster file, RanksOnHosts which ranks of a world of
  // `world` ranks live on them, KillHosts kills their daemons (returning their URLs).
  // The backend then goes on with the other hosts; the next Transform re-places the
  // state on them.
  virtual Status CheckHosts(const std::vector<int>& hosts) const;
  virtual Result<std::vector<int>> RanksOnHosts(const std::vector<int>& hosts, int world) const;
  virtual Result<std::vector<std::string>> KillHosts(const std::vector<int>& hosts);
};

// The embedded store of options.shm_dir (a fresh private directory when empty);
// work_dir() is options.work_dir or <store dir>/run.
Result<std::unique_ptr<StateBackend>> OpenEmbeddedBackend(const RunOptions& options);
// The daemons of options.cluster_path (token: options.token or TENPLEX_TOKEN); every
// daemon must run on this machine, and options.work_dir must be given.
Result<std::unique_ptr<StateBackend>> OpenClusterBackend(const RunOptions& options);

// The store path of rank `rank`'s tensor `name` in version v of job.
std::string RankTensorPath(const std::string& job, uint64_t v, int rank, const std::string& name);

}  // namespace tenplex::runtime
