#include "tenplex/store/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <utility>

#include "tenplex/io/checkpoint.h"
#include "tenplex/util/file.h"

namespace tenplex::store {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr char kManifest[] = "MANIFEST.json";
constexpr char kCurrent[] = "CURRENT";
constexpr char kManifestFormat[] = "tenplex.store.version.v1";

struct Entry {
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;
  std::string xxh64;  // cached checksum (committed tensors only)
};

struct VersionState {
  bool committed = false;
  std::string info = "{}";
  std::map<std::string, Entry> tensors;  // key "rank-00000/name"
  uint64_t bytes = 0;
};

struct JobState {
  std::optional<uint64_t> current;
  uint64_t last = 0;  // highest version number the job has had
  std::map<uint64_t, VersionState> versions;
};

std::string RandomHex() {
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Result<std::string> CanonicalInfo(const std::string& info) {
  if (info.empty()) return std::string("{}");
  json j = json::parse(info, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("version info must be a JSON object");
  return j.dump();
}

Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("mkdir " + path, errno);
  return Status::Ok();
}

// Removes everything inside dir (not dir itself).
void ClearDir(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
}

// Creates `file` (sparse, `bytes` long) and lets fill write it; it must write exactly
// `bytes` bytes.
Status FillFile(const std::string& file, uint64_t bytes, const std::function<Status(TensorSink&)>& fill) {
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("create " + file, errno);
  Status s;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) s = ErrnoError("ftruncate " + file, errno);
  if (s.ok()) {
    TensorSink sink(fd, file, bytes);
    s = fill(sink);
    if (s.ok() && sink.written() != bytes) {
      s = InvalidArgument("got " + std::to_string(sink.written()) + " bytes but dtype x shape needs " +
                          std::to_string(bytes));
    }
  }
  ::close(fd);
  return s;
}

std::string VersionName(const std::string& job, uint64_t v) {
  return "version " + std::to_string(v) + " of job '" + job + "'";
}

}  // namespace

struct Store::Impl {
  std::string dir;
  bool owned = false;
  int lock_fd = -1;
  std::string id;
  uint64_t limit = 0;
  std::atomic<uint64_t> counter{0};

  mutable std::mutex mu;
  std::map<std::string, JobState> jobs;  // guarded by mu
  uint64_t used = 0;                     // guarded by mu; includes reservations

  std::string JobDir(const std::string& job) const { return dir + "/jobs/" + job; }
  std::string VersionDir(const std::string& job, uint64_t v) const { return JobDir(job) + "/" + std::to_string(v); }
  std::string TmpName() { return dir + "/tmp/" + std::to_string(counter.fetch_add(1)); }

  // Moves a directory to trash/ (fast, under mu); the caller removes the returned
  // path after releasing mu.
  std::string Trash(const std::string& path) {
    std::string t = dir + "/trash/" + std::to_string(counter.fetch_add(1));
    if (::rename(path.c_str(), t.c_str()) != 0) return path;  // remove in place
    return t;
  }

  // REQUIRES: mu held.
  Result<JobState*> FindJob(const std::string& job) {
    TP_RETURN_IF_ERROR(CheckJobName(job));
    auto it = jobs.find(job);
    if (it == jobs.end()) return NotFound("job '" + job + "' does not exist");
    return &it->second;
  }

  // REQUIRES: mu held. Resolves "current" (nullopt) to the current version.
  Result<std::pair<uint64_t, VersionState*>> FindVersion(const std::string& job, VersionRef ref) {
    TP_ASSIGN_OR_RETURN(JobState * j, FindJob(job));
    if (!ref) {
      if (!j->current) return NotFound("job '" + job + "' has no committed version");
      ref = j->current;
    }
    auto it = j->versions.find(*ref);
    if (it == j->versions.end()) {
      std::string have;
      for (const auto& [v, s] : j->versions) {
        have += (have.empty() ? "" : ", ") + std::to_string(v) +
                (j->current == v ? " (current)" : s.committed ? " (committed)" : " (open)");
      }
      return NotFound(VersionName(job, *ref) + " does not exist (versions: " + (have.empty() ? "none" : have) + ")");
    }
    return std::make_pair(*ref, &it->second);
  }

  // REQUIRES: mu held.
  Result<std::pair<uint64_t, VersionState*>> FindOpenVersion(const TensorPath& p) {
    if (!p.version) {
      return FailedPrecondition("jobs/" + p.job + "/current is a committed version and immutable; write into an open version");
    }
    TP_ASSIGN_OR_RETURN(auto v, FindVersion(p.job, p.version));
    if (v.second->committed) {
      return FailedPrecondition(VersionName(p.job, v.first) + " is committed and immutable");
    }
    return v;
  }

  // REQUIRES: mu held.
  Result<std::pair<TensorInfo, Entry*>> FindTensor(const std::string& path) {
    TP_ASSIGN_OR_RETURN(TensorPath p, ParseTensorPath(path));
    TP_ASSIGN_OR_RETURN(auto v, FindVersion(p.job, p.version));
    auto it = v.second->tensors.find(p.Key());
    if (it == v.second->tensors.end()) {
      return NotFound("tensor '" + p.WithVersion(v.first) + "' does not exist");
    }
    return std::make_pair(MakeInfo(p.job, v.first, *v.second, it->first, it->second), &it->second);
  }

  TensorInfo MakeInfo(const std::string& job, uint64_t v, const VersionState& vs, const std::string& key,
                      const Entry& e) const {
    TensorInfo info;
    info.path = "jobs/" + job + "/" + std::to_string(v) + "/" + key;
    info.dtype = e.dtype;
    info.shape = e.shape;
    info.bytes = e.bytes;
    info.committed = vs.committed;
    info.file = VersionDir(job, v) + "/" + key;
    return info;
  }

  // REQUIRES: mu held. Removes a version from memory; returns its directory (moved to
  // trash) for removal after mu is released.
  std::string EraseVersion(const std::string& job, JobState& j, uint64_t v) {
    auto it = j.versions.find(v);
    used -= it->second.bytes;
    j.versions.erase(it);
    return Trash(VersionDir(job, v));
  }

  Status Restore();
  Status RestoreJob(const std::string& job);
  // Creates tensors beside the old ones and publishes them by rename. With `fill`
  // (one tensor), its bytes come from the callback through a sparse file's pwrite;
  // without, the files are allocated zero-filled and mapped writable into `maps`.
  using Fill = std::function<Status(TensorSink&)>;
  Result<std::vector<TensorInfo>> Create(const std::vector<AllocRequest>& reqs, const Fill* fill,
                                         std::vector<std::shared_ptr<ShmMapping>>* maps, bool zero_fill = true);
};

Status Store::Impl::Restore() {
  const std::string jobs_dir = dir + "/jobs";
  TP_RETURN_IF_ERROR(MakeDir(jobs_dir));
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(jobs_dir, ec)) names.push_back(e.path().filename().string());
  if (ec) return Internal("cannot list " + jobs_dir + ": " + ec.message());
  for (const std::string& job : names) {
    if (!IsValidSegment(job)) {
      fs::remove_all(jobs_dir + "/" + job, ec);
      continue;
    }
    TP_RETURN_IF_ERROR(RestoreJob(job));
  }
  return Status::Ok();
}

Status Store::Impl::RestoreJob(const std::string& job) {
  const std::string jdir = JobDir(job);
  std::error_code ec;
  auto cur_text = ReadFile(jdir + "/" + kCurrent);
  if (!cur_text.ok()) {  // never committed: nothing to keep
    fs::remove_all(jdir, ec);
    return Status::Ok();
  }
  std::string t = *cur_text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  auto cur = ParseVersion(t);
  if (!cur.ok() || !*cur) return DataLoss(jdir + "/" + kCurrent + " does not hold a version number");
  const uint64_t current = **cur;
  JobState js;
  for (const auto& e : fs::directory_iterator(jdir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == kCurrent) continue;
    auto v = ParseVersion(name);
    const bool keep = v.ok() && *v && **v <= current && fs::exists(e.path() / kManifest);
    if (!keep) {  // temp files, open versions, versions whose commit did not finish
      fs::remove_all(e.path(), ec);
      continue;
    }
    const std::string mpath = (e.path() / kManifest).string();
    TP_ASSIGN_OR_RETURN(std::string text, ReadFile(mpath));
    json m = json::parse(text, nullptr, false);
    if (m.is_discarded() || !m.is_object() || m.value("format", "") != kManifestFormat ||
        !m.contains("tensors") || !m["tensors"].is_array()) {
      return DataLoss(mpath + " is not a " + kManifestFormat + " manifest");
    }
    VersionState vs;
    vs.committed = true;
    if (m.contains("info") && m["info"].is_object()) vs.info = m["info"].dump();
    for (const json& t : m["tensors"]) {
      if (!t.is_object() || !t.contains("key") || !t["key"].is_string() || !t.contains("dtype") ||
          !t["dtype"].is_string() || !t.contains("shape") || !t["shape"].is_array()) {
        return DataLoss(mpath + ": malformed tensor entry");
      }
      const std::string key = t["key"].get<std::string>();
      auto p = ParseTensorPath("jobs/" + job + "/" + name + "/" + key);
      if (!p.ok()) return DataLoss(mpath + ": " + p.status().message());
      Entry en;
      auto dt = ParseDType(t["dtype"].get<std::string>());
      if (!dt.ok()) return DataLoss(mpath + ": " + dt.status().message());
      en.dtype = *dt;
      for (const json& d : t["shape"]) {
        if (!d.is_number_integer()) return DataLoss(mpath + ": shape of " + key + " has a non-integer");
        en.shape.push_back(d.get<int64_t>());
      }
      auto vol = CheckedVolume(en.shape, static_cast<int64_t>(DTypeSize(en.dtype)));
      if (!vol.ok()) return DataLoss(mpath + ": " + vol.status().message());
      en.bytes = static_cast<uint64_t>(*vol) * DTypeSize(en.dtype);
      const std::string file = (e.path() / key).string();
      struct stat st;
      if (::stat(file.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != en.bytes) {
        return DataLoss("committed tensor file " + file + " is missing or not " + std::to_string(en.bytes) +
                        " bytes long; the shared-memory directory was modified outside the store");
      }
      vs.bytes += en.bytes;
      vs.tensors.emplace(key, std::move(en));
    }
    used += vs.bytes;
    js.last = std::max(js.last, **v);
    js.versions.emplace(**v, std::move(vs));
  }
  if (!js.versions.count(current)) {
    return DataLoss(jdir + "/" + kCurrent + " names version " + std::to_string(current) +
                    " but its directory or manifest is missing");
  }
  js.current = current;
  jobs.emplace(job, std::move(js));
  return Status::Ok();
}

Result<std::vector<TensorInfo>> Store::Impl::Create(const std::vector<AllocRequest>& reqs, const Fill* fill,
                                                    std::vector<std::shared_ptr<ShmMapping>>* maps, bool zero_fill) {
  struct Pending {
    TensorPath path;
    uint64_t bytes = 0;
    std::string tmp;
    std::shared_ptr<ShmMapping> map;
  };
  std::vector<Pending> pend(reqs.size());
  uint64_t total = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    TP_ASSIGN_OR_RETURN(pend[i].path, ParseTensorPath(reqs[i].path));
    auto vol = CheckedVolume(reqs[i].shape, static_cast<int64_t>(DTypeSize(reqs[i].dtype)));
    if (!vol.ok()) return vol.status().WithContext(reqs[i].path);
    if (static_cast<std::size_t>(reqs[i].shape.size()) > kMaxRank) {
      return InvalidArgument(reqs[i].path + ": more than " + std::to_string(kMaxRank) + " dimensions");
    }
    pend[i].bytes = static_cast<uint64_t>(*vol) * DTypeSize(reqs[i].dtype);
    total += pend[i].bytes;  // each < 2^63, and the sum is checked against the limit below
    if (total < pend[i].bytes) return InvalidArgument("allocation sizes overflow");
  }
  if (fill && reqs.size() != 1) return Internal("Store: a filled create takes one tensor");
  {
    std::lock_guard<std::mutex> lock(mu);
    std::set<std::string> seen;
    for (Pending& p : pend) {
      TP_RETURN_IF_ERROR(FindOpenVersion(p.path).status());
      if (!seen.insert(p.path.job + "/" + std::to_string(*p.path.version) + "/" + p.path.Key()).second) {
        return InvalidArgument("tensor '" + p.path.WithVersion(*p.path.version) + "' is allocated twice in one request");
      }
    }
    if (total > limit || used > limit - total) {
      return ResourceExhausted("memory limit: allocating " + std::to_string(total) + " bytes would raise the store's " +
                               std::to_string(used) + " bytes in use above its limit of " + std::to_string(limit) +
                               " bytes (--memory-limit)");
    }
    used += total;
  }
  auto unreserve = [&](Status s) {
    for (Pending& p : pend) {
      if (!p.tmp.empty()) ::unlink(p.tmp.c_str());
    }
    std::lock_guard<std::mutex> lock(mu);
    used -= total;
    return s;
  };
  for (Pending& p : pend) {
    std::string tmp = TmpName();
    if (fill) {
      Status s = FillFile(tmp, p.bytes, *fill);
      p.tmp = tmp;
      if (!s.ok()) return unreserve(s.WithContext(p.path.WithVersion(*p.path.version)));
    } else if (maps) {
      auto m = ShmMapping::Create(tmp, p.bytes);
      if (!m.ok()) return unreserve(m.status());
      p.tmp = tmp;
      p.map = std::make_shared<ShmMapping>(std::move(m).value());
    } else {
      Status s = CreateShmFile(tmp, p.bytes, zero_fill);
      if (!s.ok()) return unreserve(s);
      p.tmp = tmp;
    }
  }
  std::vector<TensorInfo> out;
  std::lock_guard<std::mutex> lock(mu);
  for (Pending& p : pend) {  // all versions must still be open
    auto v = FindOpenVersion(p.path);
    if (!v.ok()) {
      Status s = v.status().WithContext("while tensors were being created");
      for (Pending& q : pend) ::unlink(q.tmp.c_str());
      used -= total;
      return s;
    }
  }
  for (std::size_t i = 0; i < pend.size(); ++i) {
    Pending& p = pend[i];
    auto [num, vs] = *FindOpenVersion(p.path);
    const std::string key = p.path.Key();
    const std::string vdir = VersionDir(p.path.job, num);
    const std::string file = vdir + "/" + key;
    Status s = MakeDir(vdir + "/" + RankSegment(p.path.rank));
    if (s.ok() && ::rename(p.tmp.c_str(), file.c_str()) != 0) s = ErrnoError("rename " + p.tmp + " to " + file, errno);
    if (!s.ok()) {  // an internal file-system error: the tensors before i stay published
      for (std::size_t k = i; k < pend.size(); ++k) {
        ::unlink(pend[k].tmp.c_str());
        used -= pend[k].bytes;
      }
      return s;
    }
    auto old = vs->tensors.find(key);
    if (old != vs->tensors.end()) {
      used -= old->second.bytes;
      vs->bytes -= old->second.bytes;
      vs->tensors.erase(old);
    }
    Entry e;
    e.dtype = reqs[i].dtype;
    e.shape = reqs[i].shape;
    e.bytes = p.bytes;
    vs->bytes += e.bytes;
    auto ins = vs->tensors.emplace(key, std::move(e)).first;
    out.push_back(MakeInfo(p.path.job, num, *vs, ins->first, ins->second));
    if (maps) maps->push_back(p.map);
  }
  return out;
}

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  auto impl = std::make_unique<Impl>();
  std::error_code ec;
  if (options.shm_dir.empty()) {
    std::string root = "/dev/shm";
    if (!fs::is_directory(root, ec)) root = fs::temp_directory_path(ec).string();
    for (int attempt = 0;; ++attempt) {
      std::string d = root + "/tenplex-" + std::to_string(::getpid()) + "-" + RandomHex().substr(0, 8);
      if (::mkdir(d.c_str(), 0700) == 0) {
        impl->dir = d;
        break;
      }
      if (errno != EEXIST || attempt > 16) return ErrnoError("mkdir " + d, errno);
    }
    impl->owned = true;
  } else {
    impl->dir = options.shm_dir;
    while (impl->dir.size() > 1 && impl->dir.back() == '/') impl->dir.pop_back();
    if (!fs::exists(impl->dir, ec) && fs::create_directories(impl->dir, ec)) {
      fs::permissions(impl->dir, fs::perms::owner_all, ec);  // tensors are for this user only
    }
    if (!fs::is_directory(impl->dir, ec)) return InvalidArgument("--shm-dir " + impl->dir + " is not a directory");
  }
  // From here on a failure removes a private directory.
  struct Cleanup {
    Impl* impl;
    ~Cleanup() {
      if (!impl) return;
      if (impl->lock_fd >= 0) ::close(impl->lock_fd);
      std::error_code ec;
      if (impl->owned) fs::remove_all(impl->dir, ec);
    }
  } cleanup{impl.get()};
  const std::string lock_path = impl->dir + "/LOCK";
  impl->lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (impl->lock_fd < 0) return ErrnoError("open " + lock_path, errno);
  if (::flock(impl->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return FailedPrecondition("shared-memory directory " + impl->dir +
                                " is in use by another tenplex store (its LOCK is held); give each store its own "
                                "--shm-dir");
    }
    return ErrnoError("flock " + lock_path, errno);
  }
  for (const char* sub : {"/tmp", "/trash"}) {
    TP_RETURN_IF_ERROR(MakeDir(impl->dir + sub));
    ClearDir(impl->dir + sub);
  }
  TP_RETURN_IF_ERROR(impl->Restore());
  impl->id = RandomHex();
  TP_RETURN_IF_ERROR(WriteFileAtomic(impl->dir + "/STORE_ID", impl->id + "\n"));
  if (options.memory_limit > 0) {
    impl->limit = options.memory_limit;
  } else {
    struct statvfs sv;
    if (::statvfs(impl->dir.c_str(), &sv) != 0) return ErrnoError("statvfs " + impl->dir, errno);
    impl->limit = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize + impl->used;
  }
  cleanup.impl = nullptr;
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

Store::~Store() {
  std::error_code ec;
  if (impl_->owned) {
    fs::remove_all(impl_->dir, ec);
  } else {
    std::vector<std::string> trash;
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      for (auto& [name, j] : impl_->jobs) {
        std::vector<uint64_t> open;
        for (auto& [v, s] : j.versions) {
          if (!s.committed) open.push_back(v);
        }
        for (uint64_t v : open) trash.push_back(impl_->EraseVersion(name, j, v));
      }
    }
    for (const std::string& t : trash) fs::remove_all(t, ec);
    ClearDir(impl_->dir + "/tmp");
    ClearDir(impl_->dir + "/trash");
  }
  if (impl_->lock_fd >= 0) ::close(impl_->lock_fd);
}

const std::string& Store::shm_dir() const { return impl_->dir; }
const std::string& Store::id() const { return impl_->id; }
uint64_t Store::memory_limit() const { return impl_->limit; }

uint64_t Store::used_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->used;
}

Result<uint64_t> Store::BeginVersion(const std::string& job, std::optional<uint64_t> version,
                                     const std::string& info) {
  TP_RETURN_IF_ERROR(CheckJobName(job));
  TP_ASSIGN_OR_RETURN(std::string canon, CanonicalInfo(info));
  if (version && (*version == 0 || *version > 999999999999999999ull)) {
    return InvalidArgument("version numbers are positive integers of at most 18 digits");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
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
  Status s = MakeDir(impl_->JobDir(job));
  if (s.ok()) s = MakeDir(impl_->VersionDir(job, v));
  if (!s.ok()) {
    if (j.versions.empty()) impl_->jobs.erase(job);
    return s;
  }
  VersionState& vs = j.versions[v];
  vs.info = canon;
  j.last = std::max(j.last, v);
  return v;
}

Status Store::SetVersionInfo(const std::string& job, uint64_t version, const std::string& info) {
  TP_ASSIGN_OR_RETURN(std::string canon, CanonicalInfo(info));
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto v, impl_->FindVersion(job, version));
  if (v.second->committed) return FailedPrecondition(VersionName(job, version) + " is committed and immutable");
  v.second->info = canon;
  return Status::Ok();
}

Status Store::Commit(const std::string& job, uint64_t version, bool keep_old) {
  std::vector<std::string> trash;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_ASSIGN_OR_RETURN(auto v, impl_->FindVersion(job, version));
    JobState& j = impl_->jobs[job];
    if (v.second->committed) return FailedPrecondition(VersionName(job, version) + " is already committed");
    if (j.current && version <= *j.current) {
      return FailedPrecondition(VersionName(job, version) + " is not newer than the current version " +
                                std::to_string(*j.current));
    }
    json m;
    m["format"] = kManifestFormat;
    m["job"] = job;
    m["version"] = version;
    m["info"] = json::parse(v.second->info);
    json ts = json::array();
    for (const auto& [key, e] : v.second->tensors) {
      ts.push_back({{"key", key}, {"dtype", DTypeName(e.dtype)}, {"shape", e.shape}, {"bytes", e.bytes}});
    }
    m["tensors"] = std::move(ts);
    const std::string vdir = impl_->VersionDir(job, version);
    TP_RETURN_IF_ERROR(WriteFileAtomic(vdir + "/" + kManifest, m.dump(1) + "\n"));
    // The commit point.
    Status s = WriteFileAtomic(impl_->JobDir(job) + "/" + kCurrent, std::to_string(version) + "\n");
    if (!s.ok()) {
      ::unlink((vdir + "/" + kManifest).c_str());
      return s;
    }
    v.second->committed = true;
    j.current = version;
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
  return Status::Ok();
}

Status Store::DropVersion(const std::string& job, uint64_t version) {
  std::string trash;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_RETURN_IF_ERROR(impl_->FindVersion(job, version).status());
    JobState& j = impl_->jobs[job];
    if (j.current == version) {
      return FailedPrecondition(VersionName(job, version) +
                                " is the current version; commit a newer one or delete the job");
    }
    trash = impl_->EraseVersion(job, j, version);
  }
  std::error_code ec;
  fs::remove_all(trash, ec);
  return Status::Ok();
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
  return Status::Ok();
}

Status Store::DeleteJob(const std::string& job) {
  std::string trash;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_ASSIGN_OR_RETURN(JobState * j, impl_->FindJob(job));
    for (const auto& [n, vs] : j->versions) impl_->used -= vs.bytes;
    impl_->jobs.erase(job);
    trash = impl_->Trash(impl_->JobDir(job));
  }
  std::error_code ec;
  fs::remove_all(trash, ec);
  return Status::Ok();
}

std::vector<std::string> Store::Jobs() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto& [name, j] : impl_->jobs) out.push_back(name);
  return out;
}

namespace {
VersionInfo MakeVersionInfo(const std::string& job, const JobState& j, uint64_t v, const VersionState& s) {
  VersionInfo vi;
  vi.job = job;
  vi.version = v;
  vi.committed = s.committed;
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
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> infos, impl_->Create({{path, dtype, shape}}, nullptr, &maps));
  TensorWriter w;
  w.info_ = std::move(infos[0]);
  w.map_ = std::move(maps[0]);
  return w;
}

Result<TensorInfo> Store::Put(const std::string& path, DType dtype, const Shape& shape, const void* data,
                              uint64_t size) {
  auto vol = CheckedVolume(shape, static_cast<int64_t>(DTypeSize(dtype)));
  if (vol.ok() && static_cast<uint64_t>(*vol) * DTypeSize(dtype) != size) {
    return InvalidArgument("body has " + std::to_string(size) + " bytes but dtype " + std::string(DTypeName(dtype)) +
                           " x shape [" + ShapeToString(shape) + "] needs " +
                           std::to_string(static_cast<uint64_t>(*vol) * DTypeSize(dtype)));
  }
  return PutFrom(path, dtype, shape, [&](TensorSink& sink) { return sink.Write(data, size); });
}

Result<TensorInfo> Store::PutFrom(const std::string& path, DType dtype, const Shape& shape,
                                  const std::function<Status(TensorSink&)>& fill) {
  Impl::Fill f = fill;
  TP_ASSIGN_OR_RETURN(std::vector<TensorInfo> infos, impl_->Create({{path, dtype, shape}}, &f, nullptr));
  return std::move(infos[0]);
}

Result<std::vector<TensorInfo>> Store::AllocateMany(const std::vector<AllocRequest>& requests, bool zero_fill) {
  return impl_->Create(requests, nullptr, nullptr, zero_fill);
}

Result<TensorInfo> Store::Link(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto src, impl_->FindTensor(from));
  if (!src.first.committed) {
    return FailedPrecondition(src.first.path + " is not committed: only immutable tensors can be linked");
  }
  TP_ASSIGN_OR_RETURN(TensorPath p, ParseTensorPath(to));
  TP_ASSIGN_OR_RETURN(auto v, impl_->FindOpenVersion(p));
  const uint64_t bytes = src.second->bytes;
  if (bytes > impl_->limit || impl_->used > impl_->limit - bytes) {
    return ResourceExhausted("memory limit: linking " + std::to_string(bytes) + " bytes would raise the store's " +
                             std::to_string(impl_->used) + " bytes in use above its limit of " +
                             std::to_string(impl_->limit) + " bytes (--memory-limit)");
  }
  const std::string key = p.Key();
  const std::string vdir = impl_->VersionDir(p.job, v.first);
  const std::string file = vdir + "/" + key;
  TP_RETURN_IF_ERROR(MakeDir(vdir + "/" + RankSegment(p.rank)));
  const std::string tmp = impl_->TmpName();
  if (::link(src.first.file.c_str(), tmp.c_str()) != 0) return ErrnoError("link " + src.first.file + " to " + tmp, errno);
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("rename " + tmp + " to " + file, err);
  }
  VersionState* vs = v.second;
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
  // Mapped under the lock so that a concurrent replace or release cannot swap the file.
  TP_ASSIGN_OR_RETURN(ShmMapping m, ShmMapping::Map(ref.info_.file, 0, ref.info_.bytes, /*writable=*/false));
  ref.map_ = std::make_shared<const ShmMapping>(std::move(m));
  return ref;
}

Result<TensorInfo> Store::Meta(const std::string& path) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto t, impl_->FindTensor(path));
  return std::move(t.first);
}

Result<std::string> Store::Checksum(const std::string& path) const {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    TP_ASSIGN_OR_RETURN(auto t, impl_->FindTensor(path));
    if (!t.second->xxh64.empty()) return t.second->xxh64;
  }
  TP_ASSIGN_OR_RETURN(TensorRef ref, Get(path));
  std::string sum = io::Xxh64Hex(ref.data(), ref.size());
  if (ref.info().committed) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto t = impl_->FindTensor(ref.info().path);  // committed tensors never change
    if (t.ok()) t->second->xxh64 = sum;
  }
  return sum;
}

Status Store::Delete(const std::string& path) {
  TP_ASSIGN_OR_RETURN(TensorPath p, ParseTensorPath(path));
  std::lock_guard<std::mutex> lock(impl_->mu);
  TP_ASSIGN_OR_RETURN(auto v, impl_->FindOpenVersion(p));
  auto it = v.second->tensors.find(p.Key());
  if (it == v.second->tensors.end()) return NotFound("tensor '" + p.WithVersion(v.first) + "' does not exist");
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
      const std::string vprefix = "jobs/" + job + "/" + std::to_string(v) + "/";
      for (const auto& [key, e] : vs.tensors) {
        if ((vprefix + key).compare(0, want.size(), want) == 0) out.push_back(impl_->MakeInfo(job, v, vs, key, e));
      }
    }
  }
  return out;
}

}  // namespace tenplex::store
