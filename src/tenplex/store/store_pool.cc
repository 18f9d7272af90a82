// The page pool (store.h): released tensor files kept for new tensors of the same job.
#include "tenplex/store/store_internal.h"

namespace tenplex::store {

void Store::Impl::PoolVersion(const std::string& job, uint64_t v, VersionState& vs) {
  if (pool_limit == 0) return;
  uint64_t added = 0;  // bytes pooled by this call: never evicted by it
  const std::string vdir = VersionDir(job, v);
  for (auto& [key, e] : vs.tensors) {
    if (e.bytes < kPoolMinBytes || added + e.bytes > pool_limit) continue;
    // A map held elsewhere in this process (a reader's TensorRef, a writer, a linked
    // tensor's entry) still sees these pages: they are not ours to reuse.
    if (e.map && e.map.use_count() > 1) continue;
    const std::string file = vdir + "/" + key;
    struct stat st;
    if (::stat(file.c_str(), &st) != 0 || st.st_nlink != 1 ||
        static_cast<uint64_t>(st.st_size) != e.bytes) {
      continue;  // linked into another version, or not what the store made
    }
    // Older files go first; those of this release are the newest, so they stay.
    if (pooled + e.bytes > pool_limit) EvictPool(pool_limit - e.bytes);
    PoolEntry p;
    p.file = PoolName();
    p.bytes = e.bytes;
    p.seq = counter.fetch_add(1);
    if (::rename(file.c_str(), p.file.c_str()) != 0) continue;
    p.map = std::move(e.map);
    pooled += p.bytes;
    added += p.bytes;
    pool[job].emplace(p.bytes, std::move(p));
  }
}

std::optional<PoolEntry> Store::Impl::TakePooled(const std::string& job, uint64_t bytes) {
  if (bytes < kPoolMinBytes) return std::nullopt;
  auto j = pool.find(job);
  if (j == pool.end()) return std::nullopt;
  auto it = j->second.lower_bound(bytes);
  // At most about twice the size: a much larger file would be truncated and its
  // pages lost to the tensors it would fit better.
  if (it == j->second.end() || it->first > 2 * bytes + (1 << 20)) return std::nullopt;
  PoolEntry e = std::move(it->second);
  j->second.erase(it);
  if (j->second.empty()) pool.erase(j);
  pooled -= e.bytes;
  return e;
}

void Store::Impl::ReturnPooled(const std::string& job, PoolEntry e) {
  pooled += e.bytes;
  pool[job].emplace(e.bytes, std::move(e));
}

void Store::Impl::EvictPool(uint64_t target) {
  while (pooled > target) {
    std::multimap<uint64_t, PoolEntry>* oldest_job = nullptr;
    std::multimap<uint64_t, PoolEntry>::iterator oldest;
    for (auto& [job, files] : pool) {
      for (auto it = files.begin(); it != files.end(); ++it) {
        if (!oldest_job || it->second.seq < oldest->second.seq) {
          oldest_job = &files;
          oldest = it;
        }
      }
    }
    if (!oldest_job) return;
    pooled -= oldest->second.bytes;
    unlink_later.push_back(oldest->second.file);
    oldest_job->erase(oldest);
  }
  for (auto it = pool.begin(); it != pool.end();) it = it->second.empty() ? pool.erase(it) : ++it;
}

bool Store::Impl::FitUnderLimit(uint64_t bytes) {
  if (bytes > limit || used > limit - bytes) return false;
  const uint64_t room = limit - bytes - used;
  if (pooled > room) EvictPool(room);
  return true;
}

void Store::Impl::DropPool(const std::string& job) {
  auto j = pool.find(job);
  if (j == pool.end()) return;
  for (auto& [size, e] : j->second) {
    pooled -= e.bytes;
    unlink_later.push_back(e.file);
  }
  pool.erase(j);
}

void Store::Impl::Sweep() {
  std::vector<std::string> files;
  {
    std::lock_guard<std::mutex> lock(mu);
    files.swap(unlink_later);
  }
  for (const std::string& f : files) ::unlink(f.c_str());
}

void Store::Impl::Released(const std::string& job) {
  Sweep();
  std::lock_guard<std::mutex> lock(listen_mu);
  for (const auto& [id, listener] : listeners) listener(job);
}

void Store::Impl::SchedulePresize(const std::string& job, const VersionState& vs) {
  if (!presizer.joinable() || pool_limit == 0) return;
  std::vector<uint64_t> sizes;
  for (const auto& [key, e] : vs.tensors) {
    if (e.bytes >= kPoolMinBytes) sizes.push_back(e.bytes);
  }
  if (sizes.empty()) return;
  for (auto& q : presize_queue) {
    if (q.first == job) {
      q.second = std::move(sizes);  // the newest version's sizes only
      return;
    }
  }
  presize_queue.emplace_back(job, std::move(sizes));
  presize_cv.notify_one();
}

void Store::Impl::PresizeLoop() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    presize_cv.wait(lock, [&] { return stopping || !presize_queue.empty(); });
    if (stopping) return;
    auto [job, sizes] = std::move(presize_queue.front());
    presize_queue.pop_front();
    // A full file system: tried again after the next commit.
    (void)FillPoolLocked(lock, job, sizes, /*job_must_exist=*/true);
  }
}

uint64_t Store::Impl::PooledFor(const std::string& job) const {
  uint64_t have = 0;
  if (auto j = pool.find(job); j != pool.end()) {
    for (const auto& [b, e] : j->second) have += b;
  }
  return have;
}

Status Store::Impl::FillPoolLocked(std::unique_lock<std::mutex>& lock, const std::string& job,
                                   const std::vector<uint64_t>& sizes, bool job_must_exist) {
  uint64_t want = 0;
  for (uint64_t b : sizes) want += b >= kPoolMinBytes ? b : 0;
  uint64_t have = PooledFor(job);
  for (uint64_t bytes : sizes) {
    if (bytes < kPoolMinBytes) continue;
    if (stopping || have >= want || (job_must_exist && !jobs.count(job))) break;
    // Only free room: pre-sizing never evicts and never takes what tensors need.
    if (pooled + bytes > pool_limit || bytes > limit || used + pooled > limit - bytes) break;
    pooled += bytes;  // counted while it is being made (but not reported: pool_bytes)
    making += bytes;
    PoolEntry e;
    e.file = PoolName();
    e.bytes = bytes;
    lock.unlock();
    Status s = CreateShmFile(e.file, bytes, /*allocate=*/true);
    if (s.ok()) {
      auto m = ShmMapping::Map(e.file, 0, bytes, /*writable=*/true, /*populate=*/true);
      if (m.ok()) {
        e.map = std::make_shared<ShmMapping>(std::move(m).value());
      } else {
        s = m.status();
      }
    }
    lock.lock();
    pooled -= bytes;
    making -= bytes;
    if (!s.ok() || stopping || (job_must_exist && !jobs.count(job))) {
      e.map.reset();
      ::unlink(e.file.c_str());
      if (!s.ok()) return s;
      continue;
    }
    e.seq = counter.fetch_add(1);
    e.clean = true;
    ReturnPooled(job, std::move(e));
    have += bytes;
  }
  return Status::Ok();
}

Result<uint64_t> Store::FillPool(const std::string& job, const std::vector<uint64_t>& sizes) {
  TP_RETURN_IF_ERROR(CheckJobName(job));
  if (impl_->pool_limit == 0)
    return FailedPrecondition("the page pool is off (page_pool_bytes 0): nothing to pre-size");
  std::unique_lock<std::mutex> lock(impl_->mu);
  TP_RETURN_IF_ERROR(impl_->FillPoolLocked(lock, job, sizes, /*job_must_exist=*/false)
                         .WithContext("pre-sizing the page pool of job " + job));
  return impl_->PooledFor(job);
}

void Store::Impl::StopPresizer() {
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
  }
  presize_cv.notify_all();
  if (presizer.joinable()) presizer.join();
}

}  // namespace tenplex::store
