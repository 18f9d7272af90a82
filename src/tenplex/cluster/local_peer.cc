#include "tenplex/cluster/local_peer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "tenplex/cluster/control_replies.h"
#include "tenplex/store/client.h"
#include "tenplex/transport/peer_files.h"
#include "tenplex/util/json_depth.h"
#include "tenplex/util/json_value.h"

namespace tenplex::cluster {

using nlohmann::json;

namespace {

// Who answers at the peer's URL: its store id and process id (GET /v1/health).
struct Identity {
  std::string store_id;
  int64_t pid = 0;
};

Result<Identity> AskIdentity(store::Client& c) {
  TP_ASSIGN_OR_RETURN(std::string text, c.CallJson("GET", "/v1/health"));
  TP_RETURN_IF_ERROR(CheckJsonDepth(text, "health reply"));
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Unavailable(c.url() + ": malformed health reply");
  return Identity{JsonValueOr(j, "store_id", std::string()), JsonValueOr(j, "pid", int64_t{0})};
}

// OK while the peer answers as the process that located the files.
Status StillThere(store::Client& c, const Identity& first) {
  Result<Identity> now = AskIdentity(c);
  if (!now.ok()) return Unavailable(now.status().message());
  if (now->store_id != first.store_id || now->pid != first.pid) {
    return Unavailable(c.url() + " restarted while its files were read");
  }
  return Status::Ok();
}

// The peer's files of the requests' regions, opened and checked (peer_files.h).
Result<std::vector<transport::PeerFile>> Locate(store::Client& c, const LocalPeer& peer,
                                                const std::vector<transport::ReadRequest>& reqs,
                                                const std::string& capability) {
  json names = json::array();
  for (const transport::ReadRequest& r : reqs) names.push_back(r.region);
  TP_ASSIGN_OR_RETURN(
      std::string text,
      c.CallJson("POST", "/v1/transform/locate",
                 json{{"capability", capability}, {"tensors", std::move(names)}}.dump()));
  Result<LocateReply> reply = DecodeLocateReply(text);
  if (!reply.ok() || reply->files.size() != reqs.size()) {
    return DataLoss(peer.url + ": malformed reply to POST /v1/transform/locate" +
                    (reply.ok() ? std::string() : ": " + reply.status().message()));
  }
  std::vector<transport::PeerFile> files;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const LocateReply::File& e = reply->files[i];
    if (e.tensor != reqs[i].region)
      return DataLoss(peer.url + ": the locate reply does not answer " + reqs[i].region);
    TP_ASSIGN_OR_RETURN(transport::PeerFile f,
                        transport::PeerFile::Open(peer.shm_dir, e.file, e.bytes, e.dev, e.ino));
    files.push_back(std::move(f));
  }
  return files;
}

// Polls the peer's health until stopped; the first failure sets `cancel`.
struct Watch {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  Status failure;  // guarded by mu
  std::atomic<bool> cancel{false};
};

void WatchPeer(Watch& w, const LocalPeer& peer, const Identity& first,
               const store::ClientOptions& co, int interval_ms) {
  Result<std::unique_ptr<store::Client>> c = store::Client::Connect(peer.url, co);
  std::unique_lock<std::mutex> lock(w.mu);
  while (!w.stop) {
    lock.unlock();
    Status s = c.ok() ? StillThere(**c, first) : Unavailable(c.status().message());
    lock.lock();
    if (!s.ok()) {
      w.failure = s;
      w.cancel = true;
      return;
    }
    w.cv.wait_for(lock, std::chrono::milliseconds(interval_ms), [&] { return w.stop; });
  }
}

}  // namespace

bool LocallyReadable(const LocalPeer& peer) {
  return !peer.empty() && !transport::HostBootId().empty() &&
         peer.host_id == transport::HostBootId() &&
         transport::SeesStoreDirectory(peer.shm_dir, peer.store_id);
}

Result<uint64_t> ReadFromLocalPeer(const LocalPeer& peer,
                                   const std::vector<transport::ReadRequest>& requests,
                                   const LocalReadOptions& options, ThreadPool* pool) {
  store::ClientOptions co;
  co.token = options.token;
  co.use_shm = false;
  co.timeout_s = options.timeout_s;
  TP_ASSIGN_OR_RETURN(std::unique_ptr<store::Client> c, store::Client::Connect(peer.url, co));
  TP_ASSIGN_OR_RETURN(Identity first, AskIdentity(*c));
  if (first.store_id != peer.store_id)
    return Unavailable(peer.url + " is another store than the one announced (restarted?)");
  TP_ASSIGN_OR_RETURN(std::vector<transport::PeerFile> files,
                      Locate(*c, peer, requests, options.capability));
  std::vector<transport::PeerFileRuns> runs;
  for (std::size_t i = 0; i < requests.size(); ++i) runs.push_back({&files[i], &requests[i].runs});

  Watch w;
  std::thread watcher(
      [&] { WatchPeer(w, peer, first, co, std::max(1, options.health_interval_ms)); });
  Result<uint64_t> read = transport::ReadPeerFiles(runs, pool, &w.cancel);
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.stop = true;
  }
  w.cv.notify_all();
  watcher.join();
  if (!w.failure.ok()) return w.failure;
  TP_RETURN_IF_ERROR(read.status());
  // Alive after the last byte too: the peer did not die while we read its files.
  TP_RETURN_IF_ERROR(StillThere(*c, first));
  return read;
}

}  // namespace tenplex::cluster
