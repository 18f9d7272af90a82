#include "tenplex/cluster/job_lease.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include "tenplex/util/format.h"
#include "tenplex/util/log.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::cluster {
namespace {

// Every request of a lease (take, renew, release) gives up after this long.
constexpr int kLeaseRequestTimeoutS = 5;

std::string HolderSafe(std::string s) {
  for (char& c : s) {
    if (!store::JobLeases::HolderChar(c)) c = '-';
  }
  return s;
}

// Indexes of the non-null clients in ascending (host id, URL) order: every coordinator
// goes through a cluster's daemons in the same order.
std::vector<std::size_t> LeaseOrder(const std::vector<store::Client*>& clients) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < clients.size(); ++i) {
    if (clients[i]) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(clients[a]->host_id(), clients[a]->url()) <
           std::pair(clients[b]->host_id(), clients[b]->url());
  });
  return order;
}

}  // namespace

std::string NewCoordinator(const std::string& what) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string name = HolderSafe(what) + "@" + HolderSafe(host[0] ? host : "host") + ":" +
                     std::to_string(::getpid()) + ":" + RandomHex();
  if (name.size() > 200) name = name.substr(name.size() - 200);
  return name;
}

Result<double> LeaseWaitFromEnv(double fallback) {
  const char* env = std::getenv("TENPLEX_LEASE_WAIT");
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (end == env || *end != '\0' || !(v >= 0))
    return InvalidArgument(
        std::string("TENPLEX_LEASE_WAIT must be a number of seconds >= 0, not '") + env + "'");
  return v;
}

struct JobLease::Impl {
  std::string job;
  store::ClientOptions options;
  JobLeaseOptions lease;
  std::vector<std::unique_ptr<store::Client>> renewers;  // own connections, lease order
  std::thread thread;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;  // guarded by mu
  Status held;            // guarded by mu

  void Renew();
  Status TakeAll(std::vector<store::Client*>& taken);
  void Release(const std::vector<store::Client*>& which);
};

// Takes the lease on the renewers in lease order: one after the other until the first
// daemon that answers grants it (two coordinators contend there, so only one passes),
// then on the rest all at once. taken: where it was granted. Refused: the first refusal.
Status JobLease::Impl::TakeAll(std::vector<store::Client*>& taken) {
  std::size_t i = 0;
  for (; i < renewers.size(); ++i) {
    Result<store::LeaseView> r = renewers[i]->AcquireLease(job, lease.ttl_ms);
    if (r.ok()) {
      taken.push_back(renewers[i].get());
      break;
    }
    if (r.status().code() != StatusCode::kUnavailable) return r.status();
  }
  if (i + 1 >= renewers.size()) return Status::Ok();
  const std::size_t rest = renewers.size() - i - 1;
  std::vector<Status> st(rest);
  ForEachConcurrently(rest, kControlConcurrency, [&](std::size_t k) {
    st[k] = renewers[i + 1 + k]->AcquireLease(job, lease.ttl_ms).status();
  });
  Status refused;
  for (std::size_t k = 0; k < rest; ++k) {
    if (st[k].ok()) {
      taken.push_back(renewers[i + 1 + k].get());
    } else if (st[k].code() != StatusCode::kUnavailable && refused.ok()) {
      refused = st[k];
    }
  }
  return refused;
}

void JobLease::Impl::Release(const std::vector<store::Client*>& which) {
  ForEachConcurrently(which.size(), kControlConcurrency,
                      [&](std::size_t i) { (void)which[i]->ReleaseLease(job); });
}

void JobLease::Impl::Renew() {
  const auto every = std::chrono::milliseconds(std::max<int64_t>(lease.ttl_ms / 4, 1));
  std::unique_lock<std::mutex> lock(mu);
  while (!cv.wait_for(lock, every, [&] { return stopping; })) {
    lock.unlock();
    ForEachConcurrently(renewers.size(), kControlConcurrency, [&](std::size_t i) {
      Result<store::LeaseView> r = renewers[i]->AcquireLease(job, lease.ttl_ms);
      // Unavailable: the daemon is gone for now (its lease comes back with our next
      // request to it). Refused: another coordinator took it: we must not decide.
      if (!r.ok() && r.status().code() != StatusCode::kUnavailable) {
        std::lock_guard<std::mutex> g(mu);
        if (held.ok()) held = r.status().WithContext("renewing the lease of job " + job);
      }
    });
    lock.lock();
  }
}

Result<std::unique_ptr<JobLease>> JobLease::Acquire(const std::vector<store::Client*>& clients,
                                                    const std::string& job,
                                                    const store::ClientOptions& options,
                                                    const JobLeaseOptions& lease) {
  if (options.coordinator.empty())
    return InvalidArgument("a job lease needs the coordinator's name (ClientOptions::coordinator)");
  for (store::Client* c : clients) {
    if (c && c->coordinator() != options.coordinator)
      return InvalidArgument("the client of " + c->url() + " names another coordinator");
  }
  // The lease's own connections, with a short timeout: a stopped daemon costs seconds
  // here (it is skipped: lost to this operation), not the caller's request timeout.
  auto impl = std::make_unique<Impl>();
  impl->job = job;
  impl->options = options;
  impl->options.timeout_s = std::min(options.timeout_s, kLeaseRequestTimeoutS);
  impl->lease = lease;
  const std::vector<std::size_t> order = LeaseOrder(clients);
  std::vector<std::optional<Result<std::unique_ptr<store::Client>>>> conns(order.size());
  ForEachConcurrently(order.size(), kControlConcurrency, [&](std::size_t k) {
    conns[k] = store::Client::Connect(clients[order[k]]->url(), impl->options);
  });
  for (std::size_t k = 0; k < order.size(); ++k) {
    Result<std::unique_ptr<store::Client>>& c = *conns[k];
    if (c.ok()) {
      impl->renewers.push_back(std::move(*c));
    } else if (c.status().code() != StatusCode::kUnavailable) {
      return c.status().WithContext(clients[order[k]]->url());
    }
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(lease.wait_s * 1000));
  std::mt19937 rng(std::random_device{}());
  bool logged = false;
  for (;;) {
    std::vector<store::Client*> taken;
    Status refused = impl->TakeAll(taken);
    if (refused.ok()) {
      impl->thread = std::thread([p = impl.get()] { p->Renew(); });
      return std::unique_ptr<JobLease>(new JobLease(std::move(impl)));
    }
    impl->Release(taken);
    if (refused.code() != StatusCode::kAborted || std::chrono::steady_clock::now() >= deadline) {
      if (refused.code() == StatusCode::kAborted && lease.wait_s > 0)
        return refused.WithContext("waited " + std::to_string(static_cast<int>(lease.wait_s)) +
                                   " s for the job's lease (TENPLEX_LEASE_WAIT)");
      return refused;
    }
    if (!logged) {
      LogInfo("waiting for the lease of job %s: %s", job.c_str(), refused.message().c_str());
      logged = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 200));
  }
}

JobLease::JobLease(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

JobLease::~JobLease() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  std::vector<store::Client*> all;
  for (auto& c : impl_->renewers) all.push_back(c.get());
  impl_->Release(all);
}

const std::string& JobLease::holder() const { return impl_->options.coordinator; }

std::vector<std::string> JobLease::hosts() const {
  std::vector<std::string> out;
  for (const auto& c : impl_->renewers) out.push_back(c->url());
  return out;
}

Status JobLease::Held() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->held;
}

}  // namespace tenplex::cluster
