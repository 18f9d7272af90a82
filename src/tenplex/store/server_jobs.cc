#include <optional>

#include "tenplex/store/server_internal.h"
#include "tenplex/util/format.h"

namespace tenplex::store {

Status Server::Impl::Jobs(const httplib::Request& req, Body& body, const Target& t,
                          const std::string& rest, httplib::Response& res) {
  const std::string& m = req.method;
  std::vector<std::string_view> seg;
  if (!rest.empty()) seg = SplitString(rest, '/');
  auto method_error = [&]() {
    SendError(res, 405, m + " is not allowed on " + t.path, "INVALID_ARGUMENT");
    return Status::Ok();
  };
  if (seg.empty()) {  // /v1/jobs
    if (m != "GET") return method_error();
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
  const std::string job(seg[0]);
  TP_RETURN_IF_ERROR(CheckJobName(job));
  if (seg.size() == 1) {  // /v1/jobs/{job}
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    if (m == "GET") {
      TP_ASSIGN_OR_RETURN(JobInfo info, store.Job(job));
      json versions = json::array();
      for (const VersionInfo& v : info.versions) versions.push_back(VersionJson(v));
      SendJson(res, 200,
               {{"job", job},
                {"current", info.current ? json(*info.current) : json(nullptr)},
                {"versions", versions}});
      return Status::Ok();
    }
    if (m == "DELETE") {
      TP_RETURN_IF_ERROR(store.DeleteJob(job));
      res.status = 204;
      return Status::Ok();
    }
    return method_error();
  }
  if (seg.size() == 2 && seg[1] == "release") {
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_RETURN_IF_ERROR(store.ReleaseOld(job));
    res.status = 204;
    return Status::Ok();
  }
  if (seg[1] != "versions" || seg.size() > 4) return NotFound("no endpoint " + m + " " + t.path);
  if (seg.size() == 2) {  // POST /v1/jobs/{job}/versions[?version=N]
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"version"}));
    std::optional<uint64_t> want;
    if (auto it = t.query.find("version"); it != t.query.end()) {
      TP_ASSIGN_OR_RETURN(want, VersionNumber(it->second));
    }
    TP_ASSIGN_OR_RETURN(std::string info, body.Text());
    TP_ASSIGN_OR_RETURN(uint64_t v, store.BeginVersion(job, want, info));
    SendJson(res, 201, {{"job", job}, {"version", v}});
    return Status::Ok();
  }
  TP_ASSIGN_OR_RETURN(VersionRef ref, ParseVersion(seg[2]));
  if (seg.size() == 3) {  // /v1/jobs/{job}/versions/{v}
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    if (m == "GET") {
      TP_ASSIGN_OR_RETURN(VersionInfo vi, store.Version(job, ref));
      SendJson(res, 200, VersionJson(vi));
      return Status::Ok();
    }
    if (m == "DELETE") {
      TP_ASSIGN_OR_RETURN(uint64_t v, VersionNumber(seg[2]));
      TP_RETURN_IF_ERROR(store.DropVersion(job, v));
      res.status = 204;
      return Status::Ok();
    }
    return method_error();
  }
  TP_ASSIGN_OR_RETURN(uint64_t v, VersionNumber(seg[2]));
  if (seg[3] == "commit") {
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {"keep_old"}));
    TP_ASSIGN_OR_RETURN(bool keep_old, FlagParam(t, "keep_old"));
    TP_RETURN_IF_ERROR(store.Commit(job, v, keep_old));
    SendJson(res, 200, {{"job", job}, {"version", v}, {"current", v}});
    return Status::Ok();
  }
  if (seg[3] == "prepare") {  // phase one of a two-phase commit: durable, immutable
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_RETURN_IF_ERROR(store.Prepare(job, v));
    SendJson(res, 200, {{"job", job}, {"version", v}, {"state", "prepared"}});
    return Status::Ok();
  }
  if (seg[3] == "abort") {
    if (m != "POST") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_ASSIGN_OR_RETURN(VersionInfo vi, store.Version(job, v));
    if (vi.committed) {
      return FailedPrecondition("version " + std::to_string(v) + " of job '" + job +
                                "' is committed; DELETE /v1/jobs/" + job + "/versions/" +
                                std::to_string(v) + " releases an old committed version");
    }
    TP_RETURN_IF_ERROR(store.DropVersion(job, v));
    res.status = 204;
    return Status::Ok();
  }
  if (seg[3] == "info") {
    if (m != "PUT") return method_error();
    TP_RETURN_IF_ERROR(CheckQueryKeys(t.query, {}));
    TP_ASSIGN_OR_RETURN(std::string info, body.Text());
    TP_RETURN_IF_ERROR(store.SetVersionInfo(job, v, info));
    res.status = 204;
    return Status::Ok();
  }
  return NotFound("no endpoint " + m + " " + t.path);
}

}  // namespace tenplex::store
