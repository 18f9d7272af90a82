#include <charconv>
#include <functional>
#include <optional>

#include "tenplex/store/server_internal.h"
#include "tenplex/util/format.h"
#include "tenplex/util/hash.h"

namespace tenplex::store {
namespace {

// 405 for a method the endpoint does not take (sent, so the request is done).
Status MethodNotAllowed(const std::string& m, const Target& t, httplib::Response& res) {
  SendError(res, 405, m + " is not allowed on " + t.path, "INVALID_ARGUMENT");
  return Status::Ok();
}

// One request below /v1/jobs/{job}: what every sub-resource handler needs. The body
// is read through body_text, only by the handlers that take one.
struct JobCall {
  Store& store;
  const std::string& m;  // the HTTP method
  const Target& t;
  httplib::Response& res;
  std::string job;
  std::function<Result<std::string>()> body_text;
  std::string coordinator;  // the request's X-Tenplex-Coordinator ("" when none)

  Status MethodError() const { return MethodNotAllowed(m, t, res); }
  // Runs a change of the job's version state under its lease (lease.h).
  Status Fenced(const std::function<Status()>& change) const {
    return store.leases().Fenced(job, coordinator, change);
  }
};

// GET /v1/jobs: every job with its current version.
Status ListJobs(Store& store, const Target& t, httplib::Response& res) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
  json out = json::array();
  for (const std::string& name : store.Jobs()) {
    auto j = store.Job(name);
    if (!j.ok()) continue;  // deleted meanwhile
    out.push_back({{"job", name}, {"current", j->current ? json(*j->current) : json(nullptr)}});
  }
  SendJson(res, 200, {{"jobs", out}});
  return Status::Ok();
}

// GET and DELETE /v1/jobs/{job}. GET ?info=digest: each version's info as its xxh64
// ("info_xxh64") instead of the info itself, which holds the placement and grows with
// the cluster (a coordinator reads every host's listing: cluster/job_listing.h): the
// xxh64 of the info as GET serves it.
Status JobResource(const JobCall& c) {
  TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {"info"}));
  auto info_q = c.t.query.find("info");
  const bool digests = info_q != c.t.query.end() && info_q->second == "digest";
  if (info_q != c.t.query.end() && !digests && info_q->second != "full")
    return InvalidArgument("query 'info' must be 'full' or 'digest', not '" + info_q->second + "'");
  if (c.m == "GET") {
    TP_ASSIGN_OR_RETURN(JobInfo info, c.store.Job(c.job));
    json versions = json::array();
    for (const VersionInfo& v : info.versions) {
      json vj = VersionJson(v, /*with_info=*/!digests);
      if (digests) {  // of the info as GET serves it (canonical JSON): what clients hash
        const std::string served = json::parse(v.info, nullptr, false).dump();
        vj["info_xxh64"] = Xxh64Hex(served.data(), served.size());
      }
      versions.push_back(std::move(vj));
    }
    SendJson(c.res, 200,
             {{"job", c.job},
              {"current", info.current ? json(*info.current) : json(nullptr)},
              {"last_version", info.last},
              {"incarnation", info.incarnation},
              {"closed_transforms", info.closed},
              {"versions", versions}});
    return Status::Ok();
  }
  if (c.m == "DELETE") {
    TP_RETURN_IF_ERROR(c.Fenced([&] { return c.store.DeleteJob(c.job); }));
    c.res.status = 204;
    return Status::Ok();
  }
  return c.MethodError();
}

// POST /v1/jobs/{job}/release.
Status ReleaseJob(const JobCall& c) {
  if (c.m != "POST") return c.MethodError();
  TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {}));
  TP_RETURN_IF_ERROR(c.Fenced([&] { return c.store.ReleaseOld(c.job); }));
  c.res.status = 204;
  return Status::Ok();
}

// POST /v1/jobs/{job}/versions[?version=N]: begins a version; the body is its info.
Status BeginVersion(const JobCall& c) {
  if (c.m != "POST") return c.MethodError();
  TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {"version"}));
  std::optional<uint64_t> want;
  if (auto it = c.t.query.find("version"); it != c.t.query.end()) {
    TP_ASSIGN_OR_RETURN(want, VersionNumber(it->second));
  }
  TP_ASSIGN_OR_RETURN(std::string info, c.body_text());
  uint64_t v = 0;
  TP_RETURN_IF_ERROR(c.Fenced([&]() -> Status {
    TP_ASSIGN_OR_RETURN(v, c.store.BeginVersion(c.job, want, info));
    return Status::Ok();
  }));
  SendJson(c.res, 201, {{"job", c.job}, {"version", v}});
  return Status::Ok();
}

// GET and DELETE /v1/jobs/{job}/versions/{v}.
Status VersionResource(const JobCall& c, std::string_view version) {
  TP_ASSIGN_OR_RETURN(VersionRef ref, ParseVersion(version));
  TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {}));
  if (c.m == "GET") {
    TP_ASSIGN_OR_RETURN(VersionInfo vi, c.store.Version(c.job, ref));
    SendJson(c.res, 200, VersionJson(vi));
    return Status::Ok();
  }
  if (c.m == "DELETE") {
    TP_ASSIGN_OR_RETURN(uint64_t v, VersionNumber(version));
    TP_RETURN_IF_ERROR(c.Fenced([&] { return c.store.DropVersion(c.job, v); }));
    c.res.status = 204;
    return Status::Ok();
  }
  return c.MethodError();
}

// POST .../abort: drops an uncommitted version (a committed one is DELETEd instead).
Status AbortVersion(const JobCall& c, uint64_t v) {
  if (c.m != "POST") return c.MethodError();
  TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {}));
  TP_RETURN_IF_ERROR(c.Fenced([&]() -> Status {
    TP_ASSIGN_OR_RETURN(VersionInfo vi, c.store.Version(c.job, v));
    if (vi.committed) {
      return FailedPrecondition("version " + std::to_string(v) + " of job '" + c.job +
                                "' is committed; DELETE /v1/jobs/" + c.job + "/versions/" +
                                std::to_string(v) + " releases an old committed version");
    }
    return c.store.DropVersion(c.job, v);
  }));
  c.res.status = 204;
  return Status::Ok();
}

// /v1/jobs/{job}/versions/{v}/{action}: commit, prepare, abort, close, info.
Status VersionAction(const JobCall& c, std::string_view version, std::string_view action) {
  TP_RETURN_IF_ERROR(ParseVersion(version).status());  // its error first, as for GET
  TP_ASSIGN_OR_RETURN(uint64_t v, VersionNumber(version));
  if (action == "commit") {
    if (c.m != "POST") return c.MethodError();
    TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {"keep_old"}));
    TP_ASSIGN_OR_RETURN(bool keep_old, FlagParam(c.t, "keep_old"));
    TP_RETURN_IF_ERROR(c.Fenced([&] { return c.store.Commit(c.job, v, keep_old); }));
    SendJson(c.res, 200, {{"job", c.job}, {"version", v}, {"current", v}});
    return Status::Ok();
  }
  if (action == "prepare") {  // phase one of a two-phase commit: durable, immutable
    if (c.m != "POST") return c.MethodError();
    TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {}));
    TP_RETURN_IF_ERROR(c.Fenced([&] { return c.store.Prepare(c.job, v); }));
    SendJson(c.res, 200, {{"job", c.job}, {"version", v}, {"state", "prepared"}});
    return Status::Ok();
  }
  if (action == "abort") return AbortVersion(c, v);
  if (action == "close") {  // the transform to v is over (committed or aborted elsewhere)
    if (c.m != "POST") return c.MethodError();
    TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {}));
    TP_RETURN_IF_ERROR(c.Fenced([&] { return c.store.CloseTransforms(c.job, v); }));
    TP_ASSIGN_OR_RETURN(JobInfo info, c.store.Job(c.job));
    SendJson(c.res, 200, {{"job", c.job}, {"closed_transforms", info.closed}});
    return Status::Ok();
  }
  if (action == "info") {
    if (c.m != "PUT") return c.MethodError();
    TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {}));
    TP_ASSIGN_OR_RETURN(std::string info, c.body_text());
    TP_RETURN_IF_ERROR(c.Fenced([&] { return c.store.SetVersionInfo(c.job, v, info); }));
    c.res.status = 204;
    return Status::Ok();
  }
  return NotFound("no endpoint " + c.m + " " + c.t.path);
}

// GET, POST (?ttl_ms=N, default kDefaultLeaseMs) and DELETE /v1/jobs/{job}/lease: the
// coordinator lease of the job (lease.h) for the request's X-Tenplex-Coordinator.
Status LeaseResource(const JobCall& c) {
  auto view = [&](const std::optional<LeaseView>& l) {
    return json{{"job", c.job},
                {"holder", l ? json(l->holder) : json(nullptr)},
                {"remaining_ms", l ? l->remaining_ms : 0}};
  };
  if (c.m == "GET") {
    TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, {}));
    SendJson(c.res, 200, view(c.store.leases().Get(c.job)));
    return Status::Ok();
  }
  if (c.m != "POST" && c.m != "DELETE") return c.MethodError();
  TP_RETURN_IF_ERROR(CheckQueryKeys(c.t.query, c.m == "POST"
                                                   ? std::vector<std::string_view>{"ttl_ms"}
                                                   : std::vector<std::string_view>{}));
  if (c.coordinator.empty())
    return InvalidArgument(
        "a lease request needs the X-Tenplex-Coordinator header naming its "
        "coordinator");
  TP_RETURN_IF_ERROR(JobLeases::CheckHolder(c.coordinator));
  if (c.m == "DELETE") {
    c.store.leases().Release(c.job, c.coordinator);
    c.res.status = 204;
    return Status::Ok();
  }
  int64_t ttl = kDefaultLeaseMs;
  if (auto it = c.t.query.find("ttl_ms"); it != c.t.query.end()) {
    const std::string& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ttl);
    if (ec != std::errc() || end != text.data() + text.size())
      return InvalidArgument("?ttl_ms must be a number of milliseconds, not '" + text + "'");
  }
  TP_ASSIGN_OR_RETURN(LeaseView l, c.store.leases().Acquire(c.job, c.coordinator, ttl));
  SendJson(c.res, 200, view(l));
  return Status::Ok();
}

}  // namespace

Status Server::Impl::Jobs(const httplib::Request& req, Body& body, const Target& t,
                          const std::string& rest, httplib::Response& res) {
  const std::string& m = req.method;
  std::vector<std::string_view> seg;
  if (!rest.empty()) seg = SplitString(rest, '/');
  if (seg.empty()) {  // /v1/jobs
    if (m != "GET") return MethodNotAllowed(m, t, res);
    return ListJobs(store, t, res);
  }
  JobCall c{store,
            m,
            t,
            res,
            std::string(seg[0]),
            [&body] { return body.Text(); },
            req.get_header_value(kCoordinatorHeader)};
  TP_RETURN_IF_ERROR(CheckJobName(c.job));
  if (seg.size() == 1) return JobResource(c);
  if (seg.size() == 2 && seg[1] == "lease") return LeaseResource(c);
  if (seg.size() == 2 && seg[1] == "release") return ReleaseJob(c);
  if (seg[1] != "versions" || seg.size() > 4) return NotFound("no endpoint " + m + " " + t.path);
  if (seg.size() == 2) return BeginVersion(c);
  if (seg.size() == 3) return VersionResource(c, seg[2]);
  return VersionAction(c, seg[2], seg[3]);
}

}  // namespace tenplex::store
