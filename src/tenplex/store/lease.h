// Coordinator leases: at most one coordinator changes the versions of a job at a time
// (docs/reliability.md, "Coordinator leases"; issue 34 finding 7).
//
// A coordinator (`tenplex transform`, `store load|save --cluster`, `tenplex run
// --cluster`, the rank 0 of a torchrun job) names itself with a holder string and takes
// the job's lease on every daemon it will touch, in ascending host-id order, before it
// reads any version state; it renews the lease while it works and releases it when it is
// done. A daemon grants a lease when the job has none, when the last one expired (its
// coordinator died or stopped: the deadline, not a failure detector, decides), or to the
// holder that has it (a renewal). So two coordinators of one job never run their
// recoveries and commits at the same time: the second waits for the lease or fails
// naming the first, and the two-phase commit's recovery rule ("a version that some live
// participant lacks is rolled back", two_phase.h), which assumes one coordinator, holds.
//
// The lease also fences: every request that changes a job's version state (begin,
// prepare, commit, abort, drop, release, delete, info) carries its coordinator's holder
// (header X-Tenplex-Coordinator) and runs through Fenced, which refuses it (Aborted,
// HTTP 409) while another holder's lease is live. A coordinator that was stopped past
// its deadline and resumes therefore cannot commit over its successor's work: its
// requests fail where the successor holds the lease, and its successor's recovery has
// already decided its half-done version. A request from a holder on a job without a
// live lease takes it (a daemon restarted mid-operation forgets its leases; the first
// request of the coordinator takes it again). Requests without a holder (single-host
// tools, older clients) pass only while no lease is live. The check and the change run
// under one lock, so a lease granted to another coordinator cannot slip between them.
// Writes of tensor bytes into an open version are not fenced: a version whose
// coordinator lost is never prepared or committed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "tenplex/util/status.h"

namespace tenplex::store {

// The header that names a request's coordinator.
inline constexpr const char* kCoordinatorHeader = "X-Tenplex-Coordinator";
// The lease a request of a coordinator takes on a job without one (ms).
inline constexpr int64_t kDefaultLeaseMs = 15000;
inline constexpr int64_t kMaxLeaseMs = 3600 * 1000;

struct LeaseView {
  std::string holder;
  int64_t remaining_ms = 0;
};

class JobLeases {
 public:
  using Clock = std::chrono::steady_clock;
  explicit JobLeases(std::function<Clock::time_point()> now = Clock::now);

  // Grants or renews the job's lease to holder for ttl_ms (1..kMaxLeaseMs); Aborted
  // naming the live holder and its remaining time when another holds it.
  Result<LeaseView> Acquire(const std::string& job, const std::string& holder, int64_t ttl_ms);
  // Ends holder's lease of the job; nothing when the lease is another's or gone.
  void Release(const std::string& job, const std::string& holder);
  // The live lease of the job, if any.
  std::optional<LeaseView> Get(const std::string& job) const;
  // Runs fn when holder may change the job (no live lease of another holder), under
  // the table's lock; a non-empty holder takes the lease when none is live
  // (kDefaultLeaseMs; its own live lease is left as it is). Aborted without running fn
  // otherwise.
  Status Fenced(const std::string& job, const std::string& holder,
                const std::function<Status()>& fn);

  // A holder is 1-200 characters of [A-Za-z0-9._:@/+=-] (HolderChar).
  static Status CheckHolder(const std::string& holder);
  static bool HolderChar(char c);

 private:
  struct Entry {
    std::string holder;
    Clock::time_point deadline;
  };
  // The live lease of the job (expired ones are dropped). REQUIRES: mu_ held.
  const Entry* LiveLocked(const std::string& job) const;
  Status BusyError(const std::string& job, const Entry& e, const std::string& who) const;

  std::function<Clock::time_point()> now_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Entry> leases_;  // guarded by mu_
};

}  // namespace tenplex::store
