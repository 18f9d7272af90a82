#include <signal.h>
#include <sys/file.h>
#include <sys/statvfs.h>

#include <chrono>
#include <cstdlib>
#include <optional>

#include "tenplex/store/manifest.h"
#include "tenplex/store/store_internal.h"
#include "tenplex/util/file.h"
#include "tenplex/util/json_value.h"
#include "tenplex/util/log.h"

namespace tenplex::store {

// A job whose files cannot be restored (corrupt or truncated manifest, missing tensor
// file, bad CURRENT) is moved aside to <dir>/quarantine/<job>[.N] with the reason in
// <job>[.N].why; the other jobs are served, and the quarantined name answers every
// request with the reason until `DeleteJob` removes it (docs/reliability.md).
Status Store::Impl::Quarantine(const std::string& job, const Status& why) {
  const std::string qdir = dir + "/quarantine";
  TP_RETURN_IF_ERROR(MakeDir(qdir));
  std::string to = qdir + "/" + job;
  std::error_code ec;
  for (int n = 1; fs::exists(to, ec) || fs::exists(to + ".why", ec); ++n)
    to = qdir + "/" + job + "." + std::to_string(n);
  if (::rename(JobDir(job).c_str(), to.c_str()) != 0)
    return ErrnoError("moving the unreadable job '" + job + "' aside to " + to, errno);
  const std::string reason = why.message();
  TP_RETURN_IF_ERROR(
      WriteFileAtomic(to + ".why", json{{"job", job}, {"reason", reason}}.dump() + "\n"));
  quarantined[job] = QuarantinedJob{reason, to};
  LogInfo("store: job '%s' quarantined (not served): %s; its files are in %s", job.c_str(),
          reason.c_str(), to.c_str());
  return Status::Ok();
}

// Jobs quarantined by an earlier start stay reported (their .why files).
void Store::Impl::ListQuarantine() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir + "/quarantine", ec)) {
    if (e.path().extension() != ".why") continue;
    Result<std::string> text = ReadRegularFile(e.path().string());
    if (!text.ok() || !CheckJsonDepth(*text).ok()) continue;
    json j = json::parse(*text, nullptr, false);
    const std::string job = JsonValueOr(j, "job", std::string());
    if (!IsValidSegment(job) || jobs.count(job) || quarantined.count(job)) continue;
    std::string path = e.path().string();
    path.resize(path.size() - 4);
    quarantined[job] = QuarantinedJob{JsonValueOr(j, "reason", std::string()), path};
  }
}

Status Store::Impl::Restore() {
  const std::string jobs_dir = dir + "/jobs";
  TP_RETURN_IF_ERROR(MakeDir(jobs_dir));
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(jobs_dir, ec))
    names.push_back(e.path().filename().string());
  if (ec) return Internal("cannot list " + jobs_dir + ": " + ec.message());
  for (const std::string& job : names) {
    if (!IsValidSegment(job)) {
      fs::remove_all(jobs_dir + "/" + job, ec);
      continue;
    }
    // A job directory must be a directory of its own: a symbolic link would alias two
    // jobs (writes of one landing in the other's files) or reach outside the store.
    const fs::file_type type = fs::symlink_status(jobs_dir + "/" + job, ec).type();
    Status s =
        type == fs::file_type::directory
            ? RestoreJob(job)
            : DataLoss(jobs_dir + "/" + job + " is " +
                       (type == fs::file_type::symlink ? "a symbolic link" : "not a directory") +
                       "; a job directory must be a real directory");
    if (!s.ok()) TP_RETURN_IF_ERROR(Quarantine(job, s));
  }
  ListQuarantine();
  return Status::Ok();
}

Status Store::Impl::CheckJobDir(const std::string& job, JobState& j) const {
  const std::string jdir = JobDir(job);
  struct stat st;
  std::string what;
  if (::lstat(jdir.c_str(), &st) != 0) {
    what = errno == ENOENT ? "is gone (removed behind the store's back)"
                           : "cannot be examined: " + ErrnoError("lstat", errno).message();
  } else if (S_ISLNK(st.st_mode)) {
    std::error_code ec;
    what = "was replaced by a symbolic link to " + fs::read_symlink(jdir, ec).string();
  } else if (!S_ISDIR(st.st_mode)) {
    what = "was replaced by something that is not a directory";
  } else if (j.dir_ino == 0) {
    j.dir_dev = st.st_dev;
    j.dir_ino = st.st_ino;
    return Status::Ok();
  } else if (st.st_dev != j.dir_dev || st.st_ino != j.dir_ino) {
    what = "was replaced by another directory";
  } else {
    return Status::Ok();
  }
  return DataLoss("job '" + job + "': its directory " + jdir + " " + what +
                  " while the store ran; refused: the store never follows it out of " + dir +
                  " (restart the daemon to quarantine it, or tenplex store rm " + job + ")");
}

Status Store::Impl::EnsureIncarnation(const std::string& job, JobState& j) {
  if (!j.incarnation.empty()) return Status::Ok();
  std::string inc = RandomHex();
  while (inc.find_first_not_of('0') == std::string::npos) inc = RandomHex();  // 0: the probe's
  TP_RETURN_IF_ERROR(WriteFileAtomic(JobDir(job) + "/" + kIncarnation, inc + "\n"));
  j.incarnation = std::move(inc);
  return Status::Ok();
}

Status Store::Impl::RaiseClosed(const std::string& job, JobState& j, uint64_t version) {
  if (version <= j.closed) return Status::Ok();
  TP_RETURN_IF_ERROR(WriteFileAtomic(JobDir(job) + "/" + kClosed, std::to_string(version) + "\n"));
  j.closed = version;
  return Status::Ok();
}

namespace {

// A small regular file's first line ("" when absent or unreadable: made anew).
std::string ReadSmallFile(const std::string& path) {
  std::error_code ec;
  if (fs::symlink_status(path, ec).type() == fs::file_type::not_found) return "";
  Result<std::string> t = ReadRegularFile(path);
  if (!t.ok()) return "";
  std::string s = *t;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

// A job directory of an older build has no INCARNATION: it gets one now. A malformed
// one is replaced (outstanding capabilities of the job on this store then die); a
// malformed CLOSED counts as none.
Status Store::Impl::RestoreJobIdentity(const std::string& job, JobState& js) {
  const std::string jdir = JobDir(job);
  std::string inc = ReadSmallFile(jdir + "/" + kIncarnation);
  if (inc.size() == 16 && inc.find_first_not_of("0123456789abcdef") == std::string::npos &&
      inc != std::string(16, '0')) {
    js.incarnation = std::move(inc);
  } else {
    TP_RETURN_IF_ERROR(EnsureIncarnation(job, js));
  }
  Result<VersionRef> closed = ParseVersion(ReadSmallFile(jdir + "/" + kClosed));
  if (closed.ok() && *closed) js.closed = **closed;
  return Status::Ok();
}

Status Store::Impl::RestoreJob(const std::string& job) {
  const std::string jdir = JobDir(job);
  std::error_code ec;
  std::optional<uint64_t> current;
  // Only regular files are read (ReadRegularFile: a FIFO named CURRENT or MANIFEST.json
  // must not block the daemon's start, a link must not read outside the store).
  if (fs::symlink_status(jdir + "/" + kCurrent, ec).type() != fs::file_type::not_found) {
    TP_ASSIGN_OR_RETURN(std::string t, ReadRegularFile(jdir + "/" + kCurrent));
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    auto cur = ParseVersion(t);
    if (!cur.ok() || !*cur)
      return DataLoss(jdir + "/" + kCurrent + " does not hold a version number");
    current = **cur;
  }
  JobState js;
  uint64_t job_bytes = 0;  // added to `used` only once the whole job is restored
  for (const auto& e : fs::directory_iterator(jdir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == kCurrent || name == kIncarnation || name == kClosed) continue;
    auto v = ParseVersion(name);
    if (v.ok() && *v && e.symlink_status(ec).type() == fs::file_type::symlink) {
      return DataLoss(e.path().string() + " is a symbolic link, not a version directory");
    }
    const bool has_manifest = v.ok() && *v && fs::exists(e.path() / kManifest);
    // Committed: at or below CURRENT. Prepared: above it, with the PREPARED marker
    // (written after the manifest), waiting for its two-phase commit to be decided.
    const bool committed = has_manifest && current && **v <= *current;
    const bool prepared = has_manifest && !committed && fs::exists(e.path() / kPrepared);
    if (!committed && !prepared) {  // temp files, open versions, unfinished prepares
      fs::remove_all(e.path(), ec);
      continue;
    }
    const std::string mpath = (e.path() / kManifest).string();
    TP_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(mpath));
    Result<Manifest> m = ParseManifest(text, job, name);
    if (!m.ok()) return m.status().WithContext(mpath);
    VersionState vs;
    vs.committed = committed;
    vs.prepared = prepared;
    vs.info = std::move(m->info);
    for (ManifestTensor& t : m->tensors) {
      const std::string key = t.key;
      Entry en;
      en.dtype = t.dtype;
      en.shape = std::move(t.shape);
      en.bytes = t.bytes;
      en.xxh64 = std::move(t.xxh64);
      const std::string file = (e.path() / key).string();
      struct stat st;  // lstat: a tensor file that is a link or a FIFO is not ours
      if (::lstat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
          static_cast<uint64_t>(st.st_size) != en.bytes) {
        return DataLoss("committed tensor file " + file +
                        " is missing, not a regular file or not " + std::to_string(en.bytes) +
                        " bytes long; the shared-memory directory was modified outside the store");
      }
      vs.bytes += en.bytes;
      vs.tensors.emplace(key, std::move(en));
    }
    job_bytes += vs.bytes;
    js.last = std::max(js.last, **v);
    js.versions.emplace(**v, std::move(vs));
  }
  if (current && !js.versions.count(*current)) {
    return DataLoss(jdir + "/" + kCurrent + " names version " + std::to_string(*current) +
                    " but its directory or manifest is missing");
  }
  if (js.versions.empty()) {  // never committed nor prepared: nothing to keep
    fs::remove_all(jdir, ec);
    return Status::Ok();
  }
  js.current = current;
  TP_RETURN_IF_ERROR(CheckJobDir(job, js));  // records the directory's identity
  TP_RETURN_IF_ERROR(RestoreJobIdentity(job, js));
  used += job_bytes;
  jobs.emplace(job, std::move(js));
  return Status::Ok();
}

// The stable identity of the daemon serving this directory (store.h, host_id()):
// made once (random hex) and kept across restarts on the same directory.
Result<std::string> LoadHostId(const std::string& dir, bool announce) {
  const std::string path = dir + "/HOST_ID";
  std::error_code ec;
  if (fs::symlink_status(path, ec).type() != fs::file_type::not_found) {
    TP_ASSIGN_OR_RETURN(std::string t, ReadRegularFile(path));
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    const bool hex = t.size() >= 8 && t.size() <= 64 &&
                     t.find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!hex) {
      return DataLoss(path + " does not hold a host id (8 to 64 lower-case hex digits); " +
                      "remove it to give this store a new host id (jobs that recorded the " +
                      "old one then no longer find their state on this host)");
    }
    return t;
  }
  const std::string id = RandomHex() + RandomHex();
  TP_RETURN_IF_ERROR(WriteFileAtomic(path, id + "\n"));
  if (announce) LogInfo("store: new host id %s (kept in %s)", id.c_str(), path.c_str());
  return id;
}

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

// A store without --shm-dir works in a private directory <root>/tenplex-<pid>-<hex>
// and removes it when it closes; one that was killed (SIGKILL, the OOM killer) leaves
// it behind, gigabytes of shared memory that nothing can ever open again (a private
// directory is never restored: a restarted store makes a new one). Such a directory
// is abandoned when all three hold: its process is gone (kill(pid, 0) says ESRCH),
// its LOCK is not held (a store in another PID namespace still holds its flock), and
// it is older than a minute (a store between its mkdir and its flock is never swept).
int SweepAbandonedPrivateDirs(const std::string& root) {
  constexpr auto kMinAge = std::chrono::minutes(1);
  std::error_code ec;
  int removed = 0;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    unsigned long pid = 0;  // NOLINT(runtime/int): strtoul's type
    char* end = nullptr;
    if (name.rfind("tenplex-", 0) != 0) continue;
    pid = std::strtoul(name.c_str() + 8, &end, 10);
    if (end == name.c_str() + 8 || *end != '-' || pid == 0 || pid > 1u << 30) continue;
    std::error_code e2;
    if (!e.is_directory(e2) || e.is_symlink(e2)) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const auto mtime = fs::last_write_time(e.path(), e2);
    if (e2 || fs::file_time_type::clock::now() - mtime < kMinAge) continue;
    const std::string lock = e.path().string() + "/LOCK";
    const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // not one of ours, or not ours to touch
    const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (free) {
      fs::remove_all(e.path(), e2);
      if (!e2) {
        ++removed;
        LogInfo("store: removed %s, the private directory of a store that is gone (pid %lu)",
                e.path().c_str(), pid);
      }
    }
    ::close(fd);
  }
  return removed;
}

Result<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  auto impl = std::make_unique<Impl>();
  std::error_code ec;
  if (options.shm_dir.empty()) {
    std::string root = "/dev/shm";
    if (!fs::is_directory(root, ec)) root = fs::temp_directory_path(ec).string();
    SweepAbandonedPrivateDirs(root);
    for (int attempt = 0;; ++attempt) {
      std::string d =
          root + "/tenplex-" + std::to_string(::getpid()) + "-" + RandomHex().substr(0, 8);
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
    if (!fs::is_directory(impl->dir, ec))
      return InvalidArgument("--shm-dir " + impl->dir + " is not a directory");
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
      return FailedPrecondition(
          "shared-memory directory " + impl->dir +
          " is in use by another tenplex store (its LOCK is held); give each store its own "
          "--shm-dir");
    }
    return ErrnoError("flock " + lock_path, errno);
  }
  // The page pool is never state: whatever a crashed store left there is removed.
  for (const char* sub : {"/tmp", "/trash", "/pool"}) {
    TP_RETURN_IF_ERROR(MakeDir(impl->dir + sub));
    ClearDir(impl->dir + sub);
  }
  TP_RETURN_IF_ERROR(impl->Restore());
  impl->id = RandomHex();
  TP_RETURN_IF_ERROR(WriteFileAtomic(impl->dir + "/STORE_ID", impl->id + "\n"));
  TP_ASSIGN_OR_RETURN(impl->host_id, LoadHostId(impl->dir, /*announce=*/!impl->owned));
  if (options.memory_limit > 0) {
    impl->limit = options.memory_limit;
  } else {
    struct statvfs sv;
    if (::statvfs(impl->dir.c_str(), &sv) != 0) return ErrnoError("statvfs " + impl->dir, errno);
    impl->limit = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize + impl->used;
  }
  impl->pool_limit = std::min(impl->limit, options.page_pool_bytes.value_or(impl->limit / 4));
  if (options.presize_pool && impl->pool_limit > 0) {
    Impl* raw = impl.get();
    impl->presizer = std::thread([raw] { raw->PresizeLoop(); });
  }
  cleanup.impl = nullptr;
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

Store::~Store() {
  impl_->StopPresizer();
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
          if (!s.committed && !s.prepared) open.push_back(v);  // prepared ones are durable
        }
        for (uint64_t v : open) trash.push_back(impl_->EraseVersion(name, j, v));
      }
    }
    for (const std::string& t : trash) fs::remove_all(t, ec);
    ClearDir(impl_->dir + "/tmp");
    ClearDir(impl_->dir + "/trash");
    ClearDir(impl_->dir + "/pool");
  }
  if (impl_->lock_fd >= 0) ::close(impl_->lock_fd);
}

}  // namespace tenplex::store
