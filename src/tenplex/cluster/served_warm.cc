#include "tenplex/cluster/served_warm.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tenplex/cluster/control_replies.h"
#include "tenplex/util/log.h"

namespace tenplex::cluster {

struct ServedWarming::State {
  std::mutex mu;
  std::condition_variable cv;
  std::size_t pending = 0;  // guarded by mu
};

ServedWarming ServedWarming::Start(const std::vector<std::string>& urls,
                                   const std::vector<std::string>& addresses,
                                   const std::vector<int>& participants,
                                   std::shared_ptr<const std::string> shared_prepare,
                                   const std::vector<HostPart>& parts,
                                   const store::ClientOptions& client_options) {
  ServedWarming w;
  w.state_ = std::make_shared<State>();
  for (std::size_t h = 0; h < urls.size() && h < parts.size(); ++h) {
    const int host = static_cast<int>(h);
    if (parts[h].served.empty() || h >= addresses.size() || addresses[h].empty() ||
        std::find(participants.begin(), participants.end(), host) != participants.end())
      continue;
    {
      std::lock_guard<std::mutex> lock(w.state_->mu);
      ++w.state_->pending;
    }
    std::thread([state = w.state_, shared_prepare, host, part = parts[h], url = urls[h],
                 client_options] {
      Result<std::unique_ptr<store::Client>> c = store::Client::Connect(url, client_options);
      Result<std::string> r = c.ok() ? (*c)->CallJson("POST", "/v1/transform/warm",
                                                      PrepareForHost(*shared_prepare, host, part))
                                     : c.status();
      Result<WarmReply> reply = r.ok() ? DecodeWarmReply(*r) : Result<WarmReply>(r.status());
      if (!reply.ok()) {
        LogVerbose(
            "warming the tensors peers fetch from %s failed (they are mapped at their "
            "first fetch instead): %s",
            url.c_str(), reply.status().ToString().c_str());
      }
      std::lock_guard<std::mutex> lock(state->mu);
      --state->pending;
      state->cv.notify_all();
    }).detach();
  }
  return w;
}

void ServedWarming::Wait(std::chrono::milliseconds within) {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait_for(lock, within, [&] { return state_->pending == 0; });
}

}  // namespace tenplex::cluster
