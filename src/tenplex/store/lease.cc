#include "tenplex/store/lease.h"

#include <algorithm>
#include <cctype>

namespace tenplex::store {
namespace {

int64_t MsBetween(JobLeases::Clock::time_point from, JobLeases::Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

}  // namespace

bool JobLeases::HolderChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("._:@/+=-").find(c) != std::string_view::npos;
}

JobLeases::JobLeases(std::function<Clock::time_point()> now) : now_(std::move(now)) {}

Status JobLeases::CheckHolder(const std::string& holder) {
  if (holder.empty() || holder.size() > 200 ||
      !std::all_of(holder.begin(), holder.end(), HolderChar))
    return InvalidArgument(
        "a coordinator (X-Tenplex-Coordinator) is 1-200 characters of letters, digits and "
        "._:@/+=-");
  return Status::Ok();
}

const JobLeases::Entry* JobLeases::LiveLocked(const std::string& job) const {
  auto it = leases_.find(job);
  if (it == leases_.end()) return nullptr;
  if (it->second.deadline <= now_()) {
    leases_.erase(it);
    return nullptr;
  }
  return &it->second;
}

Status JobLeases::BusyError(const std::string& job, const Entry& e, const std::string& who) const {
  return Aborted("job '" + job + "' is being changed by another coordinator: " + e.holder +
                 " holds its lease here for another " +
                 std::to_string(std::max<int64_t>(0, MsBetween(now_(), e.deadline))) + " ms (" +
                 (who.empty() ? std::string("this request names no coordinator")
                              : "this request comes from " + who) +
                 "); wait for it to finish, or for its lease to expire if it died");
}

Result<LeaseView> JobLeases::Acquire(const std::string& job, const std::string& holder,
                                     int64_t ttl_ms) {
  TP_RETURN_IF_ERROR(CheckHolder(holder));
  if (ttl_ms < 1 || ttl_ms > kMaxLeaseMs)
    return InvalidArgument("a lease lasts 1 to " + std::to_string(kMaxLeaseMs) + " ms, not " +
                           std::to_string(ttl_ms));
  std::lock_guard<std::mutex> lock(mu_);
  if (const Entry* e = LiveLocked(job); e && e->holder != holder) return BusyError(job, *e, holder);
  leases_[job] = Entry{holder, now_() + std::chrono::milliseconds(ttl_ms)};
  return LeaseView{holder, ttl_ms};
}

void JobLeases::Release(const std::string& job, const std::string& holder) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(job);
  if (it != leases_.end() && it->second.holder == holder) leases_.erase(it);
}

std::optional<LeaseView> JobLeases::Get(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = LiveLocked(job);
  if (!e) return std::nullopt;
  return LeaseView{e->holder, MsBetween(now_(), e->deadline)};
}

Status JobLeases::Fenced(const std::string& job, const std::string& holder,
                         const std::function<Status()>& fn) {
  if (!holder.empty()) TP_RETURN_IF_ERROR(CheckHolder(holder));
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = LiveLocked(job);
  if (e && e->holder != holder) return BusyError(job, *e, holder);
  // A holder's own lease keeps the deadline it asked for (renewals extend it).
  if (!holder.empty() && e == nullptr)
    leases_[job] = Entry{holder, now_() + std::chrono::milliseconds(kDefaultLeaseMs)};
  return fn();
}

}  // namespace tenplex::store
