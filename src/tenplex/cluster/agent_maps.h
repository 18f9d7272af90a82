// The transform agent's maps of the committed tensors peers read (agent.h), kept between
// requests.
//
// A fresh map of a tmpfs file starts with empty page tables, and on some machines a page
// fault costs more than copying the page, so every map of a tensor served over the data
// plane is pre-faulted once (Warm) and reused. Committed tensors never change; an entry
// is dropped when its tensor is gone (its version released) or replaced, checked when
// the store releases versions of a job (Store::OnRelease, which the owner forwards to
// Purge) and at every prepare. Dropped maps are destroyed on a thread of their own (the
// reaper): the last map of a released tensor frees its pages (the kernel evicts the
// unlinked file then), which for a whole version is tenths of a second that neither a
// commit nor a prepare should wait for.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tenplex/store/store.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

class ServedMaps {
 public:
  explicit ServedMaps(store::Store& store);
  ~ServedMaps();  // waits for the reaper to unmap what it holds
  ServedMaps(const ServedMaps&) = delete;
  ServedMaps& operator=(const ServedMaps&) = delete;

  // The committed tensor `path`: its cached map if it is still the store's file, else
  // mapped, pre-faulted and cached now (counted in prefaulted_on_fetch: a prepare that
  // warmed what peers read leaves none). NotFound if it is not committed.
  Result<std::shared_ptr<const store::TensorRef>> Get(const std::string& path);
  // Maps, pre-faults and caches the committed tensor `path` (replacing an entry), ahead
  // of the fetches (counted in prefaulted_ahead).
  Result<std::shared_ptr<const store::TensorRef>> Warm(const std::string& path);
  // Holds a reference to the committed tensor `path` (file `file`) in the cache, so that
  // while it is cached the store's page pool never recycles the file under a same-host
  // peer's open descriptor (a released version's files that a reference still maps are
  // not pooled, store.h). Purge drops it once the version is gone. No prefault: the
  // peer reads the file, not our map.
  Status Pin(const std::string& path, const std::string& file);
  // Drops the entries whose tensor is gone or replaced (of `job` only, if given); the
  // reaper unmaps them.
  void Purge(const std::string* job = nullptr);

  // Tensors mapped and pre-faulted by Warm, and by Get on a fetch that found no map.
  uint64_t prefaulted_ahead() const { return ahead_.load(); }
  uint64_t prefaulted_on_fetch() const { return on_fetch_.load(); }

 private:
  void ReapLoop();
  Result<std::shared_ptr<const store::TensorRef>> MapAndCache(const std::string& path);

  store::Store& store_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const store::TensorRef>> cache_;  // mu_
  std::atomic<uint64_t> ahead_{0}, on_fetch_{0};

  std::mutex reap_mu_;
  std::condition_variable reap_cv_;
  std::vector<std::shared_ptr<const store::TensorRef>> reap_;  // guarded by reap_mu_
  bool reap_stop_ = false;                                     // guarded by reap_mu_
  std::thread reaper_;
};

}  // namespace tenplex::cluster
