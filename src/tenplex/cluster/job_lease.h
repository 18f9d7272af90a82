// The coordinator's side of the job leases (store/lease.h: one coordinator changes a
// job's versions at a time; docs/reliability.md, "Coordinator leases").
//
// A coordinator names itself (NewCoordinator: what it is, host, pid, random), connects
// its clients with that name (store::ClientOptions::coordinator, so every request it
// sends is fenced by the daemons), and takes the job's lease on every daemon it will
// touch with JobLease::Acquire before it reads or decides anything. Acquire goes through
// the daemons in ascending host-id order, so two coordinators contend at the same first
// daemon rather than each holding half; when a daemon refuses (another coordinator holds
// the lease there) it releases what it took, waits a little and starts over, until
// `wait_s`; then it fails with the other coordinator's name (Aborted). The lease's
// requests go over its own connections, each bounded at 5 s: a daemon that does not
// answer is skipped (it is lost to this operation; the coordinator's requests to it
// take the lease if it comes back), costing seconds, not the caller's request timeout. While the
// JobLease lives, a thread renews the lease every ttl/4 over its own connections; a renewal that
// another coordinator's lease refuses is kept (Held) so that the coordinator can stop before its
// decision. The destructor stops renewing and releases the lease everywhere; a coordinator that
// dies leaves it to expire after its ttl.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

struct JobLeaseOptions {
  int64_t ttl_ms = store::kDefaultLeaseMs;
  // How long to wait while another coordinator holds the lease (0: fail at once).
  double wait_s = 60;
};

// A fresh coordinator name: "<what>@<host>:<pid>:<random hex>", in the characters a
// holder may use (others become '-').
std::string NewCoordinator(const std::string& what);

// The wait from TENPLEX_LEASE_WAIT (seconds) or `fallback`; InvalidArgument when the
// variable is not a number >= 0.
Result<double> LeaseWaitFromEnv(double fallback);

class JobLease {
 public:
  // Takes job's lease on every non-null client; `options` (token, timeouts, and the
  // coordinator, which must be set) are used for the renewal connections.
  static Result<std::unique_ptr<JobLease>> Acquire(const std::vector<store::Client*>& clients,
                                                   const std::string& job,
                                                   const store::ClientOptions& options,
                                                   const JobLeaseOptions& lease = {});
  ~JobLease();
  JobLease(const JobLease&) = delete;
  JobLease& operator=(const JobLease&) = delete;

  const std::string& holder() const;
  // The URLs the lease was taken on.
  std::vector<std::string> hosts() const;
  // Ok while no renewal was refused; else the first refusal (another coordinator took
  // the lease on a daemon: this coordinator must not decide).
  Status Held() const;

 private:
  struct Impl;
  explicit JobLease(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tenplex::cluster
