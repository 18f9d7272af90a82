#include "tenplex/store/store.h"

#include "tenplex/store/beneath.h"
#include "tenplex/store/store_internal.h"
#include "tenplex/util/file.h"
#include "tenplex/util/hash.h"
#include "tenplex/util/thread_pool.h"

namespace tenplex::store {

const std::string& Store::shm_dir() const { return impl_->dir; }
const std::string& Store::id() const { return impl_->id; }
const std::string& Store::host_id() const { return impl_->host_id; }
JobLeases& Store::leases() { return impl_->leases; }
uint64_t Store::memory_limit() const { return impl_->limit; }

uint64_t Store::used_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->used;
}

uint64_t Store::pool_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->pooled - impl_->making;
}

uint64_t Store::page_pool_limit() const { return impl_->pool_limit; }

uint64_t Store::pool_clean_reused_bytes() const { return impl_->clean_reused.load(); }

Result<std::shared_ptr<void>> Store::Reserve(uint64_t bytes, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->FitUnderLimit(bytes)) {
      return ResourceExhausted("memory limit: " + what + " needs " + std::to_string(bytes) +
                               " bytes; the store holds " + std::to_string(impl_->used) +
                               " of its limit of " + std::to_string(impl_->limit) +
                               " bytes (--memory-limit)");
    }
    impl_->used += bytes;
  }
  impl_->Sweep();
  Impl* impl = impl_.get();
  return std::shared_ptr<void>(nullptr, [impl, bytes](void*) {
    std::lock_guard<std::mutex> lock(impl->mu);
    impl->used -= bytes;
  });
}

std::shared_ptr<void> Store::OnRelease(std::function<void(const std::string& job)> listener) {
  Impl* impl = impl_.get();
  std::lock_guard<std::mutex> lock(impl->listen_mu);
  const uint64_t id = impl->next_listener++;
  impl->listeners.emplace(id, std::move(listener));
  return std::shared_ptr<void>(nullptr, [impl, id](void*) {
    std::lock_guard<std::mutex> lock(impl->listen_mu);
    impl->listeners.erase(id);
  });
}

namespace {

// Fencing (store.h, BeginVersion): whether version v of job may begin next to the
// versions the job already has on this store.
Status CheckFence(const std::string& job, const JobState& j, uint64_t v) {
  for (const auto& [n, other] : j.versions) {
    if (n > v && !other.committed) {
      return FailedPrecondition(VersionName(job, v) + " cannot begin: version " +
                                std::to_string(n) +
                                " was begun after it by another coordinator and supersedes it");
    }
    if (n < v && other.prepared) {
      return FailedPrecondition(
          VersionName(job, v) + " cannot begin: version " + std::to_string(n) +
          " is prepared here and awaits its coordinator's decision (another coordinator is "
          "committing it); retry once it is committed or aborted (tenplex transform --recover "
          "decides it; if a participant of it is gone for good, tenplex store rm " +
          job + " --version " + std::to_string(n) + " --cluster FILE aborts it)");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<uint64_t> Store::BeginVersion(const std::string& job, std::optional<uint64_t> version,
                                     const std::string& info, std::optional<uint64_t> made_from) {
  TP_RETURN_IF_ERROR(CheckJobName(job));
  TP_ASSIGN_OR_RETURN(std::string canon, CanonicalInfo(info));
  if (version && (*version == 0 || *version > 999999999999999999ull)) {
    return InvalidArgument("version numbers are positive integers of at most 18 digits");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_RETURN_IF_ERROR(impl_->CheckNotQuarantined(job));
  JobState& j = impl_->jobs[job];
  uint64_t v = version ? *version : std::max(j.last, j.current.value_or(0)) + 1;
  if (j.current && v <= *j.current) {
    if (j.versions.empty()) impl_->jobs.erase(job);
    return FailedPrecondition(VersionName(job, v) + " is not newer than the current version " +
                              std::to_string(*j.current));
  }
  if (j.versions.count(v)) {
    return AlreadyExists(VersionName(job, v) + " already exists");
  }
  TP_RETURN_IF_ERROR(CheckFence(job, j, v));
  if (made_from && j.current && *j.current > *made_from) {
    return FailedPrecondition(VersionName(job, v) + " cannot begin: it is made from version " +
                              std::to_string(*made_from) + " but version " +
                              std::to_string(*j.current) +
                              " was committed here meanwhile (by another coordinator); start "
                              "again from the current version");
  }
  Status s = MakeDir(impl_->JobDir(job));
  if (s.ok()) s = impl_->CheckJobDir(job, j);  // mkdir says EEXIST for a link too
  if (s.ok()) s = impl_->EnsureIncarnation(job, j);
  if (s.ok()) s = MakeDir(impl_->VersionDir(job, v));
  if (!s.ok()) {
    if (j.versions.empty()) impl_->jobs.erase(job);
    return s;
  }
  // Fencing: the open versions below v belong to coordinators that lost the race.
  for (const auto& [n, other] : j.versions) {
    if (n < v && !other.committed && !other.prepared) j.superseded[n] = v;
  }
  j.superseded.erase(v);
  while (j.superseded.size() > 64) j.superseded.erase(j.superseded.begin());
  VersionState& vs = j.versions[v];
  vs.info = canon;
  j.last = std::max(j.last, v);
  return v;
}

Status Store::SetVersionInfo(const std::string& job, uint64_t version, const std::string& info) {
  TP_ASSIGN_OR_RETURN(std::string canon, CanonicalInfo(info));
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto v, impl_->FindVersion(job, version));
  if (v.second->committed)
    return FailedPrecondition(VersionName(job, version) + " is committed and immutable");
  v.second->info = canon;
  return Status::Ok();
}

Status Store::Impl::RecordChecksums(const std::string& job, uint64_t version) {
  struct Todo {
    std::string key, file;
    uint64_t bytes, gen;
    std::shared_ptr<const ShmMapping> map;  // the kept map, if any
    std::string sum;
    Status status;
  };
  std::vector<Todo> todo;
  {
    std::lock_guard<std::mutex> lock(mu);
    TP_ASSIGN_OR_RETURN(auto v, FindVersion(job, version));
    if (v.second->committed || v.second->prepared) return Status::Ok();
    for (const auto& [key, e] : v.second->tensors) {
      if (e.xxh64.empty())
        todo.push_back({key, VersionDir(job, version) + "/" + key, e.bytes, e.gen, e.map, "", {}});
    }
  }
  ThreadPool::Default().ParallelFor(todo.size(), [&](std::size_t i) {
    Todo& t = todo[i];
    if (t.bytes == 0) {
      t.sum = Xxh64Hex(nullptr, 0);
      return;
    }
    if (t.map) {
      t.sum = Xxh64Hex(t.map->data(), t.bytes);
      return;
    }
    // Read, not mapped: building the page tables of a mapping (pre-faulted, since page
    // faults one by one cost 30x the hash on some VMs) cost more than the hash itself.
    Result<std::string> sum = Xxh64Beneath(dir, t.file, t.bytes);
    if (!sum.ok()) {
      t.status = sum.status();
      return;
    }
    t.sum = std::move(*sum);
  });
  std::lock_guard<std::mutex> lock(mu);
  TP_ASSIGN_OR_RETURN(auto v, FindVersion(job, version));
  for (const Todo& t : todo) {
    TP_RETURN_IF_ERROR(t.status.WithContext("checksum of " + t.key));
    auto it = v.second->tensors.find(t.key);
    // A tensor replaced meanwhile (against the REQUIRES of Commit) keeps no checksum.
    if (it != v.second->tensors.end() && it->second.gen == t.gen) it->second.xxh64 = t.sum;
  }
  return Status::Ok();
}

Status Store::Prepare(const std::string& job, uint64_t version) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_RETURN_IF_ERROR(impl_->CheckNotSuperseded(job, version));  // before hashing it
  }
  TP_RETURN_IF_ERROR(impl_->RecordChecksums(job, version));
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_RETURN_IF_ERROR(impl_->CheckNotSuperseded(job, version));
  TP_ASSIGN_OR_RETURN(auto v, impl_->FindVersion(job, version));
  if (v.second->committed)
    return FailedPrecondition(VersionName(job, version) + " is already committed");
  if (v.second->prepared) return Status::Ok();  // idempotent
  const std::string vdir = impl_->VersionDir(job, version);
  // Its directory must still be ours, no link (beneath.h): the manifest goes into it.
  TP_RETURN_IF_ERROR(OpenBeneath(impl_->dir, vdir, O_PATH | O_DIRECTORY).status());
  TP_RETURN_IF_ERROR(
      WriteFileAtomic(vdir + "/" + kManifest, impl_->ManifestText(job, version, *v.second)));
  // The prepare point: from here on a restart keeps the version (as prepared).
  Status s = WriteFileAtomic(vdir + "/" + kPrepared, "prepared\n");
  if (!s.ok()) {
    ::unlink((vdir + "/" + kManifest).c_str());
    return s;
  }
  v.second->prepared = true;
  return Status::Ok();
}

Status Store::Commit(const std::string& job, uint64_t version, bool keep_old) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_RETURN_IF_ERROR(impl_->CheckNotSuperseded(job, version));  // before hashing it
  }
  TP_RETURN_IF_ERROR(impl_->RecordChecksums(job, version));
  std::vector<std::string> trash;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_RETURN_IF_ERROR(impl_->CheckNotSuperseded(job, version));
    TP_ASSIGN_OR_RETURN(auto v, impl_->FindVersion(job, version));
    JobState& j = impl_->jobs[job];
    if (v.second->committed && j.current == version) {
      // Idempotent: a coordinator that lost the reply of its commit asks again.
    } else if (v.second->committed) {
      return FailedPrecondition(VersionName(job, version) + " is already committed");
    } else if (j.current && version <= *j.current) {
      return FailedPrecondition(VersionName(job, version) +
                                " is not newer than the current version " +
                                std::to_string(*j.current));
    } else {
      const std::string vdir = impl_->VersionDir(job, version);
      TP_RETURN_IF_ERROR(OpenBeneath(impl_->dir, vdir, O_PATH | O_DIRECTORY).status());
      if (!v.second->prepared) {
        TP_RETURN_IF_ERROR(
            WriteFileAtomic(vdir + "/" + kManifest, impl_->ManifestText(job, version, *v.second)));
      }
      // The commit point.
      Status s =
          WriteFileAtomic(impl_->JobDir(job) + "/" + kCurrent, std::to_string(version) + "\n");
      if (!s.ok()) {
        if (!v.second->prepared) ::unlink((vdir + "/" + kManifest).c_str());
        return s;
      }
      ::unlink((vdir + "/" + kPrepared).c_str());  // a version <= CURRENT is committed anyway
      v.second->committed = true;
      v.second->prepared = false;
      j.current = version;
      impl_->SchedulePresize(job, *v.second);
    }
    if (!keep_old) {
      std::vector<uint64_t> old;
      for (const auto& [n, vs] : j.versions) {
        if (n < version) old.push_back(n);
      }
      for (uint64_t n : old) trash.push_back(impl_->EraseVersion(job, j, n));
    }
  }
  std::error_code ec;
  for (const std::string& t : trash) fs::remove_all(t, ec);
  if (trash.empty()) {
    impl_->Sweep();  // kept the older versions: nothing released
  } else {
    impl_->Released(job);
  }
  return Status::Ok();
}

Status Store::DropVersion(const std::string& job, uint64_t version) {
  std::string trash, job_trash;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_RETURN_IF_ERROR(impl_->FindVersion(job, version).status());
    JobState& j = impl_->jobs[job];
    if (j.current == version) {
      return FailedPrecondition(VersionName(job, version) +
                                " is the current version; commit a newer one or delete the job");
    }
    const bool aborted = !j.versions.at(version).committed;
    if (aborted) {
      // An aborted version supersedes nothing any more: the versions it fenced may go on.
      std::erase_if(j.superseded, [&](const auto& e) { return e.second == version; });
    }
    trash = impl_->EraseVersion(job, j, version);
    // Its transform is over here (best effort: the capabilities expire anyway).
    if (aborted && (!j.versions.empty() || j.current)) (void)impl_->RaiseClosed(job, j, version);
    // A job exists while it has versions: dropping the only (never committed) one, as a
    // failed load does, leaves no job behind listed with "current": null.
    if (j.versions.empty() && !j.current) {
      impl_->jobs.erase(job);
      job_trash = impl_->Trash(impl_->JobDir(job));
    }
  }
  std::error_code ec;
  fs::remove_all(trash, ec);
  if (!job_trash.empty()) fs::remove_all(job_trash, ec);
  impl_->Released(job);
  return Status::Ok();
}

Status Store::CloseTransforms(const std::string& job, uint64_t version) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(JobState * j, impl_->FindJob(job));
  return impl_->RaiseClosed(job, *j, version);
}

Status Store::ReleaseOld(const std::string& job) {
  std::vector<std::string> trash;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_ASSIGN_OR_RETURN(JobState * j, impl_->FindJob(job));
    std::vector<uint64_t> old;
    for (const auto& [n, vs] : j->versions) {
      if (vs.committed && j->current && n < *j->current) old.push_back(n);
    }
    for (uint64_t n : old) trash.push_back(impl_->EraseVersion(job, *j, n));
  }
  std::error_code ec;
  for (const std::string& t : trash) fs::remove_all(t, ec);
  impl_->Released(job);
  return Status::Ok();
}

Status Store::DeleteJob(const std::string& job) {
  std::string trash;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_RETURN_IF_ERROR(CheckJobName(job));
    if (auto q = impl_->quarantined.find(job); q != impl_->quarantined.end()) {
      // Forgetting a quarantined job removes its moved-aside files.
      trash = impl_->Trash(q->second.path);
      ::unlink((q->second.path + ".why").c_str());
      impl_->quarantined.erase(q);
    } else {
      // Not FindJob: a job whose directory was replaced by a link (CheckJobDir) is
      // deleted too; Trash renames the link itself, remove_all never follows one.
      auto it = impl_->jobs.find(job);
      if (it == impl_->jobs.end()) return NotFound("job '" + job + "' does not exist");
      for (const auto& [n, vs] : it->second.versions) impl_->used -= vs.bytes;
      impl_->jobs.erase(it);
      impl_->DropPool(job);
      trash = impl_->Trash(impl_->JobDir(job));
    }
  }
  std::error_code ec;
  fs::remove_all(trash, ec);
  impl_->Released(job);
  return Status::Ok();
}

std::vector<Store::Quarantined> Store::QuarantinedJobs() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<Quarantined> out;
  for (const auto& [job, q] : impl_->quarantined) out.push_back({job, q.reason, q.path});
  return out;
}

std::vector<std::string> Store::Jobs() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [name, j] : impl_->jobs) out.push_back(name);
  return out;
}

namespace {
VersionInfo MakeVersionInfo(const std::string& job, const JobState& j, uint64_t v,
                            const VersionState& s) {
  VersionInfo vi;
  vi.job = job;
  vi.version = v;
  vi.committed = s.committed;
  vi.prepared = s.prepared;
  vi.current = j.current == v;
  vi.bytes = s.bytes;
  vi.tensors = s.tensors.size();
  vi.info = s.info;
  return vi;
}
}  // namespace

Result<JobInfo> Store::Job(const std::string& job) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(JobState * j, impl_->FindJob(job));
  JobInfo info;
  info.job = job;
  info.current = j->current;
  info.last = j->last;
  info.incarnation = j->incarnation;
  info.closed = j->closed;
  for (const auto& [v, s] : j->versions) info.versions.push_back(MakeVersionInfo(job, *j, v, s));
  return info;
}

Result<VersionInfo> Store::Version(const std::string& job, VersionRef version) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto v, impl_->FindVersion(job, version));
  return MakeVersionInfo(job, impl_->jobs[job], v.first, *v.second);
}

Result<TensorWriter> Store::Allocate(const std::string& path, DType dtype, const Shape& shape) {
  std::vector<std::shared_ptr<ShmMapping>> maps;
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> infos,
                      impl_->Create({{path, dtype, shape}}, nullptr, &maps));
  TensorWriter w;
  w.info_ = std::move(infos[0]);
  w.map_ = std::move(maps[0]);
  return w;
}

Result<TensorInfo> Store::Put(const std::string& path, DType dtype, const Shape& shape,
                              const void* data, uint64_t size) {
  auto vol = CheckedVolume(shape, static_cast<int64_t>(DTypeSize(dtype)));
  if (vol.ok() && static_cast<uint64_t>(*vol) * DTypeSize(dtype) != size) {
    return InvalidArgument("body has " + std::to_string(size) + " bytes but dtype " +
                           std::string(DTypeName(dtype)) + " x shape [" + ShapeToString(shape) +
                           "] needs " +
                           std::to_string(static_cast<uint64_t>(*vol) * DTypeSize(dtype)));
  }
  return PutFrom(path, dtype, shape, [&](TensorSink& sink) { return sink.Write(data, size); });
}

Result<TensorInfo> Store::PutFrom(const std::string& path, DType dtype, const Shape& shape,
                                  const std::function<Status(TensorSink&)>& fill) {
  Impl::Fill f = fill;
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> infos,
                      impl_->Create({{path, dtype, shape}}, &f, nullptr));
  return std::move(infos[0]);
}

Result<std::vector<TensorInfo>> Store::AllocateMany(const std::vector<AllocRequest>& requests,
                                                    bool zero_fill) {
  return impl_->Create(requests, nullptr, nullptr, zero_fill);
}

Result<TensorInfo> Store::Link(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto src, impl_->FindTensor(from));
  if (!src.first.committed) {
    return FailedPrecondition(src.first.path +
                              " is not committed: only immutable tensors can be linked");
  }
  TP_ASSIGN_OR_RETURN(TensorPath p, ParseTensorPath(to));
  TP_ASSIGN_OR_RETURN(auto v, impl_->FindOpenVersion(p));
  const uint64_t bytes = src.second->bytes;
  if (!impl_->FitUnderLimit(bytes)) {
    return ResourceExhausted("memory limit: linking " + std::to_string(bytes) +
                             " bytes would raise the store's " + std::to_string(impl_->used) +
                             " bytes in use above its limit of " + std::to_string(impl_->limit) +
                             " bytes (--memory-limit)");
  }
  const std::string key = p.Key();
  const std::string vdir = impl_->VersionDir(p.job, v.first);
  const std::string file = vdir + "/" + key;
  VersionState* vs = v.second;
  TP_RETURN_IF_ERROR(MakeRankDir(vdir, p.rank, *vs));
  // Straight to its name; a tensor it replaces is swapped atomically (link, rename).
  // Into the rank directory opened beneath the store's (no link followed: beneath.h).
  TP_ASSIGN_OR_RETURN(ParentDir to_dir, OpenParentBeneath(impl_->dir, file));
  const char* to_name = to_dir.name.c_str();
  if (::linkat(AT_FDCWD, src.first.file.c_str(), to_dir.dir.get(), to_name, 0) != 0) {
    if (errno != EEXIST) return ErrnoError("link " + src.first.file + " to " + file, errno);
    const std::string tmp = impl_->TmpName();
    if (::link(src.first.file.c_str(), tmp.c_str()) != 0)
      return ErrnoError("link " + src.first.file + " to " + tmp, errno);
    if (::renameat(AT_FDCWD, tmp.c_str(), to_dir.dir.get(), to_name) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      return ErrnoError("rename " + tmp + " to " + file, err);
    }
  }
  auto old = vs->tensors.find(key);
  if (old != vs->tensors.end()) {
    impl_->used -= old->second.bytes;
    vs->bytes -= old->second.bytes;
    vs->tensors.erase(old);
  }
  Entry e = *src.second;
  impl_->used += e.bytes;
  vs->bytes += e.bytes;
  auto ins = vs->tensors.emplace(key, std::move(e)).first;
  return impl_->MakeInfo(p.job, v.first, *vs, ins->first, ins->second);
}

Result<TensorRef> Store::Get(const std::string& path) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto t, impl_->FindTensor(path));
  TensorRef ref;
  ref.info_ = std::move(t.first);
  if (t.second->map) {  // the store's own map: no new page tables
    ref.map_ = t.second->map;
    return ref;
  }
  // Mapped under the lock so that a concurrent replace or release cannot swap the file.
  TP_ASSIGN_OR_RETURN(ShmMapping m, MapBeneath(impl_->dir, ref.info_.file, ref.info_.bytes));
  ref.map_ = std::make_shared<const ShmMapping>(std::move(m));
  return ref;
}

Result<TensorInfo> Store::Meta(const std::string& path) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto t, impl_->FindTensor(path));
  return std::move(t.first);
}

Result<std::string> Store::Checksum(const std::string& path) const {
  // Always hashed now: a cached value would hide bytes changed behind the store's back.
  TP_ASSIGN_OR_RETURN(TensorRef ref, Get(path));
  ref.Prefault();
  std::string sum = Xxh64Hex(ref.data(), ref.size());
  const std::string& recorded = ref.info().xxh64;
  if (!recorded.empty() && sum != recorded) {
    return DataLoss("tensor " + ref.info().path + " is corrupt: its bytes have xxh64 " + sum +
                    " but " + recorded +
                    " was recorded when its version was committed (its shared-memory file " +
                    ref.info().file + " was changed behind the store's back)");
  }
  if (recorded.empty() && ref.info().committed) {
    // A committed version restored from a manifest of an older build: record it now.
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto t = impl_->FindTensor(ref.info().path);
    if (t.ok() && t->second->xxh64.empty()) t->second->xxh64 = sum;
  }
  return sum;
}

Status Store::Delete(const std::string& path) {
  TP_ASSIGN_OR_RETURN(TensorPath p, ParseTensorPath(path));
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto v, impl_->FindOpenVersion(p));
  auto it = v.second->tensors.find(p.Key());
  if (it == v.second->tensors.end())
    return NotFound("tensor '" + p.WithVersion(v.first) + "' does not exist");
  const std::string file = impl_->VersionDir(p.job, v.first) + "/" + it->first;
  if (::unlink(file.c_str()) != 0) return ErrnoError("unlink " + file, errno);
  impl_->used -= it->second.bytes;
  v.second->bytes -= it->second.bytes;
  v.second->tensors.erase(it);
  return Status::Ok();
}

Result<std::vector<TensorInfo>> Store::List(const std::string& prefix) const {
  TP_ASSIGN_OR_RETURN(ListPrefix lp, ParseListPrefix(prefix));
  std::vector<TensorInfo> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (lp.segments.size() >= 2) TP_RETURN_IF_ERROR(impl_->CheckNotQuarantined(lp.segments[1]));
  if (lp.segments.size() >= 3 && lp.segments[2] == "current") {
    auto it = impl_->jobs.find(lp.segments[1]);
    if (it == impl_->jobs.end() || !it->second.current) return out;
    lp.segments[2] = std::to_string(*it->second.current);
  }
  std::string want;
  for (const std::string& s : lp.segments) want += s + "/";
  want += lp.partial;
  for (const auto& [job, j] : impl_->jobs) {
    if (lp.segments.size() >= 2 && job != lp.segments[1]) continue;
    for (const auto& [v, vs] : j.versions) {
      if (lp.segments.size() >= 3 && std::to_string(v) != lp.segments[2]) continue;
      const std::string vprefix = VersionPrefix(job, v);
      for (const auto& [key, e] : vs.tensors) {
        if ((vprefix + key).compare(0, want.size(), want) == 0)
          out.push_back(impl_->MakeInfo(job, v, vs, key, e));
      }
    }
  }
  return out;
}

}  // namespace tenplex::store
