// The in-process transport: peers are transports of this process, found in a
// process-wide registry by id; a fetch looks the region up on the serving transport and
// copies with memcpy on the calling thread.
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "tenplex/transport/protocol.h"
#include "tenplex/transport/transport.h"

namespace tenplex::transport {
namespace {

constexpr std::string_view kKind = "inproc";

// The serving side of one transport. Readers hold `mu` shared while they use `lookup`;
// the owner takes it exclusively to retire the server, so no read runs after that.
struct Server {
  std::shared_mutex mu;
  bool retired = false;
  RegionLookup lookup;
  std::optional<std::string> probe_key;
  RefusalCounter probe_refused;
};

struct Registry {
  std::mutex mu;
  std::map<uint64_t, std::shared_ptr<Server>> servers;
  uint64_t next_id = 1;
};

Registry& TheRegistry() {
  static Registry* r = new Registry;
  return *r;
}

struct Payload {
  uint64_t id;
  uint64_t pid;
};

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(RegionLookup lookup, std::optional<std::string> probe_key)
      : server_(std::make_shared<Server>()) {
    server_->lookup = std::move(lookup);
    server_->probe_key = std::move(probe_key);
    Registry& reg = TheRegistry();
    std::lock_guard<std::mutex> l(reg.mu);
    id_ = reg.next_id++;
    reg.servers[id_] = server_;
  }

  ~InProcessTransport() override {
    {
      Registry& reg = TheRegistry();
      std::lock_guard<std::mutex> l(reg.mu);
      reg.servers.erase(id_);
    }
    std::unique_lock<std::shared_mutex> l(server_->mu);
    server_->retired = true;
    server_->lookup = nullptr;
  }

  std::string_view kind() const override { return kKind; }

  std::string LocalAddress() const override {
    const Payload p{id_, static_cast<uint64_t>(::getpid())};
    return EncodeAddress(kKind, std::string_view(reinterpret_cast<const char*>(&p), sizeof(p)));
  }

  Result<PeerId> Connect(std::string_view address) override {
    TP_ASSIGN_OR_RETURN(std::string bytes, DecodeAddress(kKind, address));
    if (bytes.size() != sizeof(Payload)) {
      return InvalidArgument("in-process transport address of the wrong length");
    }
    Payload p;
    std::memcpy(&p, bytes.data(), sizeof(p));
    if (p.pid != static_cast<uint64_t>(::getpid())) {
      return InvalidArgument("in-process transport address of another process (pid " +
                             std::to_string(p.pid) + ")");
    }
    return PeerId{p.id};
  }

  void Disconnect(PeerId) override {}

  Status Fetch(PeerId peer, const std::vector<ReadRequest>& requests) override {
    TP_RETURN_IF_ERROR(CheckReadRequests(requests));
    std::shared_ptr<Server> server;
    {
      Registry& reg = TheRegistry();
      std::lock_guard<std::mutex> l(reg.mu);
      auto it = reg.servers.find(peer);
      if (it != reg.servers.end()) server = it->second;
    }
    if (!server) return Unavailable("in-process peer " + std::to_string(peer) + " is gone");
    std::shared_lock<std::shared_mutex> l(server->mu);
    if (server->retired) return Unavailable("in-process peer " + std::to_string(peer) + " is gone");
    Status first;
    for (const ReadRequest& q : requests) {
      Status s = Read(*server, q);
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  }

  uint64_t ProbeRefused(CapabilityRefusal reason) const override {
    return server_->probe_refused.Get(reason);
  }

 private:
  static Status Read(Server& server, const ReadRequest& q) {
    TP_ASSIGN_OR_RETURN(Region region, FindRegion(server.lookup, q.region, q.capability,
                                                  server.probe_key, &server.probe_refused));
    std::vector<WireRun> wire(q.runs.size());
    for (std::size_t i = 0; i < q.runs.size(); ++i) wire[i] = {q.runs[i].offset, q.runs[i].length};
    TP_RETURN_IF_ERROR(CheckRuns(q.region, region.size, wire.data(), wire.size()));
    const char* base = static_cast<const char*>(region.data);
    for (const ReadRun& run : q.runs) {
      if (run.length > 0) std::memcpy(run.dest, base + run.offset, run.length);
    }
    return Status::Ok();
  }

  std::shared_ptr<Server> server_;
  uint64_t id_ = 0;
};

}  // namespace

Result<std::unique_ptr<Transport>> NewInProcessTransport(RegionLookup lookup,
                                                         const TransportOptions& options) {
  return std::unique_ptr<Transport>(new InProcessTransport(std::move(lookup), options.probe_key));
}

}  // namespace tenplex::transport
