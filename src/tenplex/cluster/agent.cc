#include "tenplex/cluster/agent.h"

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "tenplex/cluster/agent_common.h"
#include "tenplex/cluster/agent_impl.h"
#include "tenplex/cluster/control_replies.h"
#include "tenplex/store/parse.h"
#include "tenplex/transport/capability.h"
#include "tenplex/transport/peer_files.h"
#include "tenplex/util/json_value.h"

namespace tenplex::cluster {

using nlohmann::json;

Agent::Impl::Impl(store::Store& s, AgentOptions o)
    : store(s), options(std::move(o)), maps(s), prober(s, options.capability_key) {
  release_listener = store.OnRelease([this](const std::string& job) { maps.Purge(&job); });
}

Agent::Impl::~Impl() {
  release_listener.reset();  // waits for a call in progress
}

std::string Agent::Impl::Capability(const PrepareRequest& r, int peer) {
  const int64_t now = transport::UnixSeconds();
  return transport::MintCapability(
      options.capability_key, {r.job, r.from_version, r.to_version,
                               now + options.capability_lifetime_seconds, r.incarnations[peer]});
}

Status Agent::Impl::Authorize(std::string_view name, std::string_view capability) {
  const int64_t now = transport::UnixSeconds();
  transport::CapabilityCheck c =
      transport::CheckCapability(options.capability_key, capability, now);
  if (c.refusal == transport::CapabilityRefusal::kNone) {
    Result<store::TensorPath> p = store::ParseTensorPath(name);
    if (!p.ok() || p->job != c.grant.job || p->version != c.grant.from_version) {
      c.refusal = transport::CapabilityRefusal::kScope;
      c.why = "the fetch's capability does not cover " + std::string(name);
    } else if (Result<store::JobInfo> j = store.Job(c.grant.job); !j.ok()) {
      // No such job here: the lookup says so.
    } else if (j->incarnation != c.grant.incarnation) {
      c.refusal = transport::CapabilityRefusal::kScope;
      c.why = "the fetch's capability is for another incarnation of job " + c.grant.job +
              " (deleted and created again since, or another host's)";
    } else if ((j->current && *j->current >= c.grant.to_version) ||
               j->closed >= c.grant.to_version) {
      c.refusal = transport::CapabilityRefusal::kExpired;
      c.why = "the fetch's capability expired: its transform to version " +
              std::to_string(c.grant.to_version) + " is over";
    }
  }
  if (c.refusal == transport::CapabilityRefusal::kNone) return Status::Ok();
  metrics.CountRefused(c.refusal);
  return PermissionDenied(c.why);
}

// Peers read committed tensors only, by store path, with a capability; the probe
// regions (fixed patterns) with a probe capability (issue 35: they were open to all).
Result<transport::Region> Agent::Impl::Lookup(std::string_view name, std::string_view capability) {
  if (name == AgentProber::kScratchRegion) return prober.Scratch(capability, metrics.refusals());
  TP_RETURN_IF_ERROR(Authorize(name, capability));
  TP_ASSIGN_OR_RETURN(std::shared_ptr<const store::TensorRef> ref, maps.Get(std::string(name)));
  return transport::Region{ref->data(), ref->size(), ref};
}

// A same-host peer's question where the tensors it may read are: for each (in order), the
// committed tensor's file, size and identity, if the capability covers it (Authorize, as
// for a data-plane fetch; refusals are counted the same way).
Result<std::string> Agent::Impl::Locate(const std::string& body) {
  if (!options.local_peer_reads)
    return FailedPrecondition("this daemon does not offer same-host reads (--no-local-peer-reads)");
  TP_ASSIGN_OR_RETURN(json j, ParseRequestBody(body));
  const std::string capability = JsonValueOr(j, "capability", std::string());
  if (!j.contains("tensors") || !j["tensors"].is_array() || j["tensors"].size() > 100000)
    return InvalidArgument("'tensors' must be an array of at most 100000 store paths");
  if (fault_at > 0 && fault_in_locate && ++locates == fault_at) {
    std::fprintf(stderr, "tenplex store: fault injection: exiting in a peer's locate\n");
    std::_Exit(137);  // as if SIGKILLed: a peer is about to read our files
  }
  LocateReply reply;
  for (const json& t : j["tensors"]) {
    if (!t.is_string()) return InvalidArgument("'tensors' entries must be strings");
    const std::string path = t.get<std::string>();
    TP_RETURN_IF_ERROR(Authorize(path, capability));
    TP_ASSIGN_OR_RETURN(store::TensorInfo meta, store.Meta(path));
    if (!meta.committed) return NotFound(path + " is not committed");
    TP_RETURN_IF_ERROR(maps.Pin(path, meta.file));
    TP_ASSIGN_OR_RETURN(transport::FileIdentity id, transport::IdentifyFile(meta.file));
    if (id.bytes != meta.bytes)
      return DataLoss(path + ": its file has " + std::to_string(id.bytes) + " bytes, not " +
                      std::to_string(meta.bytes));
    reply.files.push_back({path, meta.file, meta.bytes, id.dev, id.ino});
  }
  metrics.CountLocated(reply.files.size());
  return EncodeLocateReply(reply);
}

// POST names a job ({"job": J}): the reply adds this store's incarnation of it, if any
// (the coordinator's capabilities name it: transport/capability.h).
std::string Agent::Impl::AddressReply(const std::string& job) {
  cluster::AddressReply reply;  // the struct (control_replies.h), not this method
  reply.address = transport->LocalAddress();
  reply.kind = std::string(transport->kind());
  if (Result<store::JobInfo> j = store.Job(job); !job.empty() && j.ok())
    reply.incarnation = j->incarnation;
  if (options.local_peer_reads && !transport::HostBootId().empty())
    reply.local =
        cluster::AddressReply::Local{transport::HostBootId(), store.shm_dir(), store.id()};
  return EncodeAddressReply(reply);
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() = default;

Result<std::unique_ptr<Agent>> Agent::Create(store::Store& store, const AgentOptions& options) {
  auto impl = std::make_unique<Impl>(store, options);
  if (!options.fault.empty()) {
    const std::string f = options.fault;
    const std::string kind = f.substr(0, f.find(':'));
    const std::string n = f.find(':') == std::string::npos ? "1" : f.substr(f.find(':') + 1);
    if ((kind != "exit-in-prepare" && kind != "exit-in-locate") || n.empty() || n.size() > 6 ||
        n.find_first_not_of("0123456789") != std::string::npos || std::stoi(n) < 1) {
      return InvalidArgument("fault '" + f +
                             "': expected exit-in-prepare[:N] or exit-in-locate[:N] (N >= 1)");
    }
    impl->fault_at = std::stoi(n);
    impl->fault_in_locate = kind == "exit-in-locate";
  }
  Impl* raw = impl.get();
  transport::TransportOptions to = options.transport_options;
  to.probe_key = options.capability_key;  // the probe region too needs a capability
  TP_ASSIGN_OR_RETURN(impl->transport,
                      transport::NewTransport(
                          options.transport,
                          [raw](std::string_view name, std::string_view capability) {
                            return raw->Lookup(name, capability);
                          },
                          to));
  impl->prober.set_transport(impl->transport.get());
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

std::string Agent::address() const { return impl_->transport->LocalAddress(); }
std::string Agent::metrics() const { return impl_->MetricsText(); }

void Agent::Install(store::Server& server) {
  server.AddMetricsSource([this] { return impl_->MetricsText(); });
  server.AddJsonRoute(
      "/v1/transform/",
      [this](const std::string& method, const std::string& path, const std::string& body,
             const std::string& coordinator) { return Handle(method, path, body, coordinator); });
}

Result<std::string> Agent::Handle(const std::string& method, const std::string& path,
                                  const std::string& body, const std::string& coordinator) {
  if (path == "/v1/transform/address") {
    if (method == "GET") return impl_->AddressReply();
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    TP_ASSIGN_OR_RETURN(json j, ParseRequestBody(body));
    if (!j.contains("job") || !j["job"].is_string())
      return InvalidArgument("'job' must be a string");
    TP_RETURN_IF_ERROR(store::CheckJobName(j["job"].get<std::string>()));
    return impl_->AddressReply(j["job"].get<std::string>());
  }
  if (path == "/v1/transform/locate") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->Locate(body);
  }
  if (path == "/v1/transform/prepare") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->Prepare(body, coordinator);
  }
  if (path == "/v1/transform/presize") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->Presize(body);
  }
  if (path == "/v1/transform/warm") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->Warm(body);
  }
  if (path == "/v1/transform/probe") {
    if (method != "POST") return InvalidArgument(method + " is not allowed on " + path);
    return impl_->prober.Probe(body);
  }
  return NotFound("no endpoint " + method + " " + path + " (see docs/transform.md)");
}

}  // namespace tenplex::cluster
