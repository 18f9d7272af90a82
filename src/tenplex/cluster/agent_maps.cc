#include "tenplex/cluster/agent_maps.h"

#include "tenplex/store/parse.h"

namespace tenplex::cluster {

ServedMaps::ServedMaps(store::Store& store) : store_(store) {
  reaper_ = std::thread([this] { ReapLoop(); });
}

ServedMaps::~ServedMaps() {
  {
    std::lock_guard<std::mutex> lock(reap_mu_);
    reap_stop_ = true;
  }
  reap_cv_.notify_one();
  reaper_.join();
}

void ServedMaps::ReapLoop() {
  std::unique_lock<std::mutex> lock(reap_mu_);
  while (true) {
    reap_cv_.wait(lock, [&] { return reap_stop_ || !reap_.empty(); });
    if (reap_.empty()) return;  // stopping, nothing left
    std::vector<std::shared_ptr<const store::TensorRef>> now;
    now.swap(reap_);
    lock.unlock();
    now.clear();
    lock.lock();
  }
}

Result<std::shared_ptr<const store::TensorRef>> ServedMaps::Get(const std::string& path) {
  TP_ASSIGN_OR_RETURN(store::TensorInfo meta, store_.Meta(path));
  if (!meta.committed) return NotFound(path + " is not committed");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(path);
    if (it != cache_.end() && it->second->info().file == meta.file) return it->second;
  }
  ++on_fetch_;
  return MapAndCache(path);
}

Result<std::shared_ptr<const store::TensorRef>> ServedMaps::Warm(const std::string& path) {
  ++ahead_;
  return MapAndCache(path);
}

Result<std::shared_ptr<const store::TensorRef>> ServedMaps::MapAndCache(const std::string& path) {
  TP_ASSIGN_OR_RETURN(store::TensorRef ref, store_.Get(path));
  if (!ref.info().committed) return NotFound(path + " is not committed");
  ref.Prefault();
  auto hold = std::make_shared<const store::TensorRef>(std::move(ref));
  std::lock_guard<std::mutex> lock(mu_);
  cache_[path] = hold;
  return hold;
}

Status ServedMaps::Pin(const std::string& path, const std::string& file) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(path);
    if (it != cache_.end() && it->second->info().file == file) return Status::Ok();
  }
  TP_ASSIGN_OR_RETURN(store::TensorRef ref, store_.Get(path));
  if (!ref.info().committed) return NotFound(path + " is not committed");
  auto hold = std::make_shared<const store::TensorRef>(std::move(ref));
  std::lock_guard<std::mutex> lock(mu_);
  cache_[path] = std::move(hold);
  return Status::Ok();
}

void ServedMaps::Purge(const std::string* job) {
  auto other_job = [job](const std::string& path) {
    if (!job) return false;
    Result<store::TensorPath> p = store::ParseTensorPath(path);
    return p.ok() && p->job != *job;
  };
  std::vector<std::shared_ptr<const store::TensorRef>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = cache_.begin(); it != cache_.end();) {
      if (other_job(it->first)) {
        ++it;
        continue;
      }
      Result<store::TensorInfo> meta = store_.Meta(it->first);
      if (!meta.ok() || meta->file != it->second->info().file) {
        dropped.push_back(std::move(it->second));
        it = cache_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (dropped.empty()) return;
  std::lock_guard<std::mutex> lock(reap_mu_);
  for (auto& d : dropped) reap_.push_back(std::move(d));
  reap_cv_.notify_one();
}

}  // namespace tenplex::cluster
