#define FUSE_USE_VERSION 312
#include "tenplex/data/fuse_mount.h"

#include <dirent.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>

namespace tenplex::data {

namespace {

constexpr int kKickSignal = SIGUSR2;

void NoOpHandler(int) {}

void InstallKickHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = NoOpHandler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocking read returns EINTR
    sigaction(kKickSignal, &sa, nullptr);
  });
}

sigset_t StopSignals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGHUP);
  return s;
}

}  // namespace

struct FuseMount::Impl {
  std::shared_ptr<const FileTree> view;
  std::string mountpoint;
  MountOptions options;
  time_t mounted_at = 0;
  struct fuse* fuse = nullptr;
  struct fuse_session* session = nullptr;

  std::vector<std::thread> workers;
  std::vector<pthread_t> worker_ids;
  std::atomic<int> running{0};
  std::atomic<bool> stop{false};
  std::mutex error_mu;
  Status error;

  std::thread watcher;
  std::atomic<bool> done{false};
  std::mutex finish_mu;
  bool finished = false;

  static Impl* Self() { return static_cast<Impl*>(fuse_get_context()->private_data); }

  void Serve() {
    sigset_t block = StopSignals(), unblock;
    pthread_sigmask(SIG_BLOCK, &block, nullptr);
    sigemptyset(&unblock);
    sigaddset(&unblock, kKickSignal);
    pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
    struct fuse_buf buf;
    std::memset(&buf, 0, sizeof buf);
    while (!stop.load()) {
      int res = fuse_session_receive_buf(session, &buf);
      if (res == -EINTR || res == -EAGAIN) continue;
      if (res == 0 || res == -ENODEV) break;  // unmounted
      if (res < 0) {
        std::lock_guard<std::mutex> l(error_mu);
        if (error.ok()) error = ErrnoError("reading FUSE requests", -res);
        break;
      }
      fuse_session_process_buf(session, &buf);
    }
    std::free(buf.mem);
    stop.store(true);  // one thread seeing the end ends them all
    running.fetch_sub(1);
  }

  // Flags the workers and kicks them out of blocking reads until all have left.
  void StopWorkers() {
    stop.store(true);
    while (running.load() > 0) {
      for (pthread_t t : worker_ids) pthread_kill(t, kKickSignal);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // Joins, unmounts, frees. Runs once.
  void Finish() {
    std::lock_guard<std::mutex> l(finish_mu);
    if (finished) return;
    for (auto& t : workers) t.join();
    done.store(true);
    if (watcher.joinable()) {
      pthread_kill(watcher.native_handle(), SIGTERM);  // wakes its sigwait
      watcher.join();
    }
    fuse_unmount(fuse);  // closes the device (ending any request) and detaches the mount
    fuse_destroy(fuse);
    fuse = nullptr;
    finished = true;
  }
};

namespace {

using Impl = FuseMount::Impl;

std::string_view Rel(const char* path) {
  std::string_view p(path);
  while (!p.empty() && p.front() == '/') p.remove_prefix(1);
  return p;
}

void* OpInit(struct fuse_conn_info*, struct fuse_config* cfg) {
  cfg->kernel_cache = 0;
  cfg->entry_timeout = 3600;  // the view never changes while mounted
  cfg->attr_timeout = 3600;
  cfg->negative_timeout = 3600;
  return fuse_get_context()->private_data;
}

int OpGetattr(const char* path, struct stat* st, struct fuse_file_info*) {
  Impl* self = Impl::Self();
  std::memset(st, 0, sizeof *st);
  st->st_uid = ::getuid();
  st->st_gid = ::getgid();
  st->st_mtime = st->st_ctime = st->st_atime = self->mounted_at;
  std::string_view p = Rel(path);
  if (self->view->IsDir(p)) {
    st->st_mode = S_IFDIR | 0555;
    st->st_nlink = 2;
    return 0;
  }
  if (const ViewFile* f = self->view->File(p)) {
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
    st->st_size = static_cast<off_t>(f->size());
    st->st_blocks = (st->st_size + 511) / 512;
    return 0;
  }
  return -ENOENT;
}

int OpReaddir(const char* path, void* buf, fuse_fill_dir_t fill, off_t, struct fuse_file_info*,
              enum fuse_readdir_flags) {
  Impl* self = Impl::Self();
  std::string_view p = Rel(path);
  if (!self->view->IsDir(p)) return self->view->File(p) ? -ENOTDIR : -ENOENT;
  fill(buf, ".", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  fill(buf, "..", nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  for (const std::string& name : self->view->List(p)) {
    fill(buf, name.c_str(), nullptr, 0, static_cast<fuse_fill_dir_flags>(0));
  }
  return 0;
}

int OpOpen(const char* path, struct fuse_file_info* fi) {
  Impl* self = Impl::Self();
  std::string_view p = Rel(path);
  const ViewFile* f = self->view->File(p);
  if (!f) return self->view->IsDir(p) ? -EISDIR : -ENOENT;
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  fi->fh = reinterpret_cast<uint64_t>(f);
  fi->keep_cache = 0;
  return 0;
}

int OpRead(const char*, char* buf, size_t size, off_t offset, struct fuse_file_info* fi) {
  const ViewFile* f = reinterpret_cast<const ViewFile*>(fi->fh);
  if (offset < 0) return -EINVAL;
  auto n = f->Read(static_cast<uint64_t>(offset), size, buf);
  if (!n.ok()) {
    std::fprintf(stderr, "tenplex: read error: %s\n", n.status().message().c_str());
    return -EIO;
  }
  return static_cast<int>(*n);
}

int OpStatfs(const char*, struct statvfs* st) {
  std::memset(st, 0, sizeof *st);
  st->f_bsize = 4096;
  st->f_namemax = 255;
  return 0;
}

const struct fuse_operations kOps = [] {
  struct fuse_operations ops;
  std::memset(&ops, 0, sizeof ops);
  ops.init = OpInit;
  ops.getattr = OpGetattr;
  ops.readdir = OpReaddir;
  ops.open = OpOpen;
  ops.read = OpRead;
  ops.statfs = OpStatfs;
  return ops;
}();

// Best effort: the kernel's readahead window for this mount's backing device (the
// per-mount bdi "MAJOR:MINOR"). Sequential readers then get requests of up to 1 MiB
// (libfuse negotiates max_pages = 256) instead of 128 KiB. Needs root; silently left
// at the default otherwise. Called once the workers serve (stat asks the mount).
void SetReadAhead(const std::string& mountpoint, int kb) {
  struct stat st;
  if (::stat(mountpoint.c_str(), &st) != 0) return;
  char path[96];
  std::snprintf(path, sizeof path, "/sys/class/bdi/%u:%u/read_ahead_kb", major(st.st_dev),
                minor(st.st_dev));
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  const std::string v = std::to_string(kb);
  if (::write(fd, v.data(), v.size()) < 0) {
    // left at the kernel default
  }
  ::close(fd);
}

}  // namespace

FuseMount::FuseMount(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FuseMount::~FuseMount() { Stop(); }

Result<std::unique_ptr<FuseMount>> FuseMount::Start(std::shared_ptr<const FileTree> view,
                                                    const std::string& mountpoint,
                                                    const MountOptions& options) {
  if (options.threads < 1) return InvalidArgument("need at least one serving thread");
  struct stat st;
  if (::stat(mountpoint.c_str(), &st) != 0) return ErrnoError("mountpoint " + mountpoint, errno);
  if (!S_ISDIR(st.st_mode))
    return InvalidArgument("mountpoint " + mountpoint + " is not a directory");
  // A mount would hide what is there (and a trainer would read the wrong files).
  if (DIR* d = ::opendir(mountpoint.c_str())) {
    std::string first;
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
        first = e->d_name;
        break;
      }
    }
    ::closedir(d);
    if (!first.empty()) {
      return FailedPrecondition("mountpoint " + mountpoint + " is not empty (it holds '" + first +
                                "'): mount on an empty directory");
    }
  }
  if (::access("/dev/fuse", R_OK | W_OK) != 0) {
    return FailedPrecondition(std::string("/dev/fuse is not usable (") + std::strerror(errno) +
                              "): load the fuse module (modprobe fuse) or run the container with "
                              "--device /dev/fuse --cap-add SYS_ADMIN");
  }
  InstallKickHandler();
  auto impl = std::make_unique<Impl>();
  impl->view = std::move(view);
  impl->mountpoint = mountpoint;
  impl->options = options;
  impl->mounted_at = std::time(nullptr);

  std::string opts = "ro,default_permissions,fsname=tenplex-data,subtype=tenplex";
  if (options.allow_other) opts += ",allow_other";
  std::vector<std::string> argv_s = {"tenplex", "-o", opts};
  if (options.debug) argv_s.push_back("-d");
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  struct fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  impl->fuse = fuse_new(&args, &kOps, sizeof kOps, impl.get());
  fuse_opt_free_args(&args);
  if (!impl->fuse) return Internal("fuse_new failed (bad FUSE options?)");
  if (fuse_mount(impl->fuse, mountpoint.c_str()) != 0) {
    fuse_destroy(impl->fuse);
    return Unavailable("cannot mount FUSE at " + mountpoint +
                       " (is /dev/fuse usable and the mountpoint not already a mount?)");
  }
  impl->session = fuse_get_session(impl->fuse);

  Impl* p = impl.get();
  if (options.handle_signals) {
    sigset_t s = StopSignals();
    pthread_sigmask(SIG_BLOCK, &s, nullptr);  // inherited by the threads created below
  }
  p->running.store(options.threads);
  for (int i = 0; i < options.threads; ++i) {
    p->workers.emplace_back([p] { p->Serve(); });
    p->worker_ids.push_back(p->workers.back().native_handle());
  }
  if (options.handle_signals) {
    p->watcher = std::thread([p] {
      sigset_t s = StopSignals();
      int sig = 0;
      sigwait(&s, &sig);
      if (!p->done.load()) p->StopWorkers();
    });
  }
  if (options.read_ahead_kb > 0) SetReadAhead(mountpoint, options.read_ahead_kb);
  return std::unique_ptr<FuseMount>(new FuseMount(std::move(impl)));
}

Status FuseMount::Wait() {
  while (impl_->running.load() > 0) {
    // Once one thread has ended serving (unmount, error), the others may still be
    // blocked in a read: kick them out too.
    if (impl_->stop.load()) impl_->StopWorkers();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  impl_->Finish();
  std::lock_guard<std::mutex> l(impl_->error_mu);
  return impl_->error;
}

void FuseMount::Stop() {
  if (!impl_) return;
  impl_->StopWorkers();
  impl_->Finish();
}

}  // namespace tenplex::data
