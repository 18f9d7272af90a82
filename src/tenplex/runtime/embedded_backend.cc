// The state backend of a run without --cluster: a tensor store embedded in the runner.
#include <nlohmann/json.hpp>

#include "tenplex/runtime/backend.h"
#include "tenplex/store/parse.h"
#include "tenplex/store/store.h"
#include "tenplex/transform/local.h"

namespace tenplex::runtime {

using nlohmann::json;

std::string RankTensorPath(const std::string& job, uint64_t v, int rank, const std::string& name) {
  return store::TensorPathOf(job, v, rank, name);
}

Status StateBackend::CheckHosts(const std::vector<int>& hosts) const {
  if (hosts.empty()) return Status::Ok();
  return InvalidArgument("kill_hosts needs tenplex run --cluster (store daemons as hosts)");
}

Result<std::vector<int>> StateBackend::RanksOnHosts(const std::vector<int>& hosts,
                                                    int world) const {
  TP_RETURN_IF_ERROR(CheckHosts(hosts));
  (void)world;
  return std::vector<int>{};
}

Result<std::vector<std::string>> StateBackend::KillHosts(const std::vector<int>& hosts) {
  TP_RETURN_IF_ERROR(CheckHosts(hosts));
  return std::vector<std::string>{};
}

namespace {

class EmbeddedBackend : public StateBackend {
 public:
  EmbeddedBackend(std::unique_ptr<store::Store> st, const RunOptions& o)
      : st_(std::move(st)),
        work_(o.work_dir.empty() ? st_->shm_dir() + "/run" : o.work_dir),
        work_kept_(!o.work_dir.empty() || !o.shm_dir.empty()) {}

  std::string work_dir() const override { return work_; }
  bool work_dir_kept() const override { return work_kept_; }

  Result<std::optional<Committed>> Current(const std::string& job) override {
    Result<store::VersionInfo> v = st_->Version(job, std::nullopt);
    if (!v.ok() && v.status().code() == StatusCode::kNotFound) return std::optional<Committed>();
    if (!v.ok()) return v.status();
    TP_ASSIGN_OR_RETURN(io::StateInfo info, io::ParseStateInfo(job, v->version, v->info));
    return std::optional<Committed>(Committed{v->version, std::move(info)});
  }

  Result<uint64_t> BeginLayout(const std::string& job, const Layout& layout,
                               io::StateInfo info) override {
    TP_ASSIGN_OR_RETURN(uint64_t v, st_->BeginVersion(job, std::nullopt, info.ToJson()));
    for (const RankLayout& r : layout.ranks) {
      for (const LocalTensor& t : *r.tensors) {
        auto w = st_->Allocate(RankTensorPath(job, v, r.rank, t.name), t.dtype, t.shape);
        if (!w.ok()) {
          (void)st_->DropVersion(job, v);
          return w.status();
        }
      }
    }
    return v;
  }

  Result<std::vector<std::map<std::string, std::string>>> Files(const std::string& job, uint64_t v,
                                                                const Layout& layout) override {
    std::vector<std::map<std::string, std::string>> out(layout.world_size());
    for (const RankLayout& r : layout.ranks) {
      for (const LocalTensor& t : *r.tensors) {
        TP_ASSIGN_OR_RETURN(store::TensorInfo ti,
                            st_->Meta(RankTensorPath(job, v, r.rank, t.name)));
        out[r.rank][t.name] = ti.file;
      }
    }
    return out;
  }

  Status Commit(const std::string& job, uint64_t v, const io::StateInfo& info) override {
    TP_RETURN_IF_ERROR(st_->SetVersionInfo(job, v, info.ToJson()));
    return st_->Commit(job, v);
  }

  void Drop(const std::string& job, uint64_t v) override { (void)st_->DropVersion(job, v); }

  Result<Moved> Transform(const std::string& job, const ParallelConfig& to) override {
    TP_ASSIGN_OR_RETURN(transform::LocalTransformStats ts,
                        transform::TransformLocal(*st_, job, to));
    return Moved{ts.new_version, ts.bytes_copied, ts.plan.bytes_total, ts.plan.bytes_in_place};
  }

 private:
  std::unique_ptr<store::Store> st_;
  std::string work_;
  bool work_kept_;
};

}  // namespace

Result<std::unique_ptr<StateBackend>> OpenEmbeddedBackend(const RunOptions& o) {
  store::StoreOptions so;
  so.shm_dir = o.shm_dir;
  TP_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> st, store::Store::Open(so));
  return std::unique_ptr<StateBackend>(std::make_unique<EmbeddedBackend>(std::move(st), o));
}

}  // namespace tenplex::runtime
