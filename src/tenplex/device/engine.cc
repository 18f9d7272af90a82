#include "tenplex/device/engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <thread>

namespace tenplex::device {
namespace {

constexpr uint64_t kMaxChunk = 1ull << 30;

// The files of a call, opened once (read-only for a restore, read-write for a commit)
// and closed with it.
class Files {
 public:
  ~Files() {
    for (int fd : fds_) close(fd);
  }
  Status Open(const std::vector<Span>& spans, Direction dir) {
    for (const Span& s : spans) {
      if (s.bytes == 0) {
        fds_.push_back(-1);
        continue;
      }
      if (s.device == 0)
        return InvalidArgument(s.path + ": null device address for " + std::to_string(s.bytes) +
                               " bytes");
      if (s.offset > UINT64_MAX - s.bytes)
        return InvalidArgument(s.path + ": offset + bytes overflows");
      int flags = (dir == Direction::kHostToDevice ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NOFOLLOW |
                  O_NONBLOCK;
      int fd = open(s.path.c_str(), flags);
      if (fd < 0) {
        int e = errno;
        return e == ENOENT ? NotFound(s.path + ": no such file")
                           : ErrnoError("opening " + s.path, e);
      }
      fds_.push_back(fd);
      struct stat st {};
      if (fstat(fd, &st) != 0) return ErrnoError("fstat " + s.path, errno);
      if (!S_ISREG(st.st_mode)) return InvalidArgument(s.path + ": not a regular file");
      if (static_cast<uint64_t>(st.st_size) < s.offset + s.bytes) {
        return InvalidArgument(s.path + ": has " + std::to_string(st.st_size) +
                               " bytes, the copy needs " + std::to_string(s.offset + s.bytes) +
                               " (offset " + std::to_string(s.offset) + " + " +
                               std::to_string(s.bytes) + ")");
      }
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }
    return Status::Ok();
  }
  const std::vector<int>& fds() const { return fds_; }

 private:
  std::vector<int> fds_;
};

// pread/pwrite of exactly n bytes at off; a short read means the file shrank under us.
Status FullIo(int fd, void* buf, uint64_t n, uint64_t off, Direction dir, const std::string& path) {
  auto* p = static_cast<char*>(buf);
  uint64_t done = 0;
  while (done < n) {
    ssize_t r = dir == Direction::kHostToDevice
                    ? pread(fd, p + done, n - done, static_cast<off_t>(off + done))
                    : pwrite(fd, p + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return ErrnoError((dir == Direction::kHostToDevice ? "reading " : "writing ") + path, errno);
    if (r == 0) {
      return DataLoss(path + ": ended at " + std::to_string(off + done) + " bytes, expected " +
                      std::to_string(off + n));
    }
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

// The first error of a call; workers stop at their next chunk once one is set.
class FirstError {
 public:
  void Set(const Status& s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> l(mu_);
    if (status_.ok()) status_ = s;
    failed_ = true;
  }
  bool failed() const { return failed_.load(); }
  Status Get() {
    std::lock_guard<std::mutex> l(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  Status status_;
  std::atomic<bool> failed_{false};
};

}  // namespace

Result<Mode> ParseMode(std::string_view text) {
  if (text == "auto") return Mode::kAuto;
  if (text == "staged") return Mode::kStaged;
  if (text == "registered") return Mode::kRegistered;
  return InvalidArgument("copy mode '" + std::string(text) + "': use auto, staged or registered");
}

std::string_view ModeName(Mode mode) {
  switch (mode) {
    case Mode::kAuto:
      return "auto";
    case Mode::kStaged:
      return "staged";
    case Mode::kRegistered:
      return "registered";
  }
  return "?";
}

std::vector<Chunk> SplitChunks(const std::vector<Span>& spans, uint64_t chunk_bytes) {
  std::vector<Chunk> out;
  for (size_t i = 0; i < spans.size(); ++i) {
    for (uint64_t off = 0; off < spans[i].bytes; off += chunk_bytes) {
      out.push_back(Chunk{i, off, std::min(chunk_bytes, spans[i].bytes - off)});
    }
  }
  return out;
}

CopyEngine::CopyEngine(std::unique_ptr<Backend> backend, const EngineOptions& options)
    : backend_(std::move(backend)), options_(options) {}

CopyEngine::~CopyEngine() {
  for (void* p : slots_) backend_->FreePinned(p);
}

Result<std::unique_ptr<CopyEngine>> CopyEngine::Make(std::unique_ptr<Backend> backend,
                                                     const EngineOptions& o) {
  if (o.chunk_bytes < 4096 || o.chunk_bytes > kMaxChunk) {
    return InvalidArgument("copy engine: chunk_bytes must be 4096..2^30, got " +
                           std::to_string(o.chunk_bytes));
  }
  if (o.slots < 1 || o.slots > 64) return InvalidArgument("copy engine: slots must be 1..64");
  if (o.threads < 1 || o.threads > 64) return InvalidArgument("copy engine: threads must be 1..64");
  if (backend->events() < o.threads * o.slots) {
    return InvalidArgument("copy engine: the backend has " + std::to_string(backend->events()) +
                           " events, the ring needs " + std::to_string(o.threads * o.slots));
  }
  auto e = std::unique_ptr<CopyEngine>(new CopyEngine(std::move(backend), o));
  TP_RETURN_IF_ERROR(e->backend_->BindThread());
  for (int i = 0; i < o.threads * o.slots; ++i) {
    TP_ASSIGN_OR_RETURN(void* p, e->backend_->AllocPinned(o.chunk_bytes));
    e->slots_.push_back(p);
  }
  return e;
}

Result<CopyStats> CopyEngine::Restore(const std::vector<Span>& spans) {
  return Run(spans, Direction::kHostToDevice);
}
Result<CopyStats> CopyEngine::Commit(const std::vector<Span>& spans) {
  return Run(spans, Direction::kDeviceToHost);
}

Result<CopyStats> CopyEngine::Run(const std::vector<Span>& spans, Direction dir) {
  std::lock_guard<std::mutex> l(mu_);
  auto t0 = std::chrono::steady_clock::now();
  Files files;
  TP_RETURN_IF_ERROR(files.Open(spans, dir));
  TP_RETURN_IF_ERROR(backend_->BindThread());
  CopyStats stats;
  for (const Span& s : spans) stats.bytes += s.bytes;
  Status st;
  if (options_.mode == Mode::kRegistered) {
    st = RunRegistered(spans, files.fds(), dir, stats);
    if (!st.ok() && !stats.fallback.empty()) st = RunStaged(spans, files.fds(), dir, stats);
  } else {
    st = RunStaged(spans, files.fds(), dir, stats);
  }
  TP_RETURN_IF_ERROR(st);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

// Worker t of the staged path: every threads-th chunk, through its own ring of slots.
// A chunk is "issued" (restore: read into the slot, copy queued; commit: copy queued)
// and later "completed" (restore: nothing; commit: the slot written to the file) after
// its slot's event; a slot is issued again only after its last chunk completed.
Status CopyEngine::RunStaged(const std::vector<Span>& spans, const std::vector<int>& fds,
                             Direction dir, CopyStats& stats) {
  std::vector<Chunk> chunks = SplitChunks(spans, options_.chunk_bytes);
  stats.mode = "staged";
  stats.chunks = chunks.size();
  const int threads =
      static_cast<int>(std::min<size_t>(static_cast<size_t>(options_.threads), chunks.size()));
  FirstError error;
  auto worker = [&](int t) {
    Status bound = backend_->BindThread();
    if (!bound.ok()) return error.Set(bound);
    const int stream = t % backend_->streams();
    std::deque<std::pair<const Chunk*, int>> inflight;  // (chunk, slot index)
    auto complete = [&]() {
      auto [c, slot] = inflight.front();
      inflight.pop_front();
      Status s = backend_->WaitEvent(slot);
      if (s.ok() && dir == Direction::kDeviceToHost && !error.failed()) {
        const Span& sp = spans[c->span];
        s = FullIo(fds[c->span], slots_[static_cast<size_t>(slot)], c->bytes, sp.offset + c->offset,
                   dir, sp.path);
      }
      error.Set(s);
    };
    int next = 0;
    for (size_t k = static_cast<size_t>(t); k < chunks.size() && !error.failed();
         k += static_cast<size_t>(threads)) {
      if (static_cast<int>(inflight.size()) == options_.slots) complete();
      const Chunk& c = chunks[k];
      const Span& sp = spans[c.span];
      const int slot = t * options_.slots + next;
      next = (next + 1) % options_.slots;
      void* buf = slots_[static_cast<size_t>(slot)];
      auto* dev = reinterpret_cast<char*>(static_cast<uintptr_t>(sp.device)) + c.offset;
      Status s;
      if (dir == Direction::kHostToDevice) {
        s = FullIo(fds[c.span], buf, c.bytes, sp.offset + c.offset, dir, sp.path);
        if (s.ok()) s = backend_->CopyAsync(dev, buf, c.bytes, dir, stream);
      } else {
        s = backend_->CopyAsync(buf, dev, c.bytes, dir, stream);
      }
      if (s.ok()) s = backend_->RecordEvent(slot, stream);
      error.Set(s);
      if (s.ok()) inflight.emplace_back(&c, slot);
    }
    while (!inflight.empty()) complete();
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  if (threads > 0) worker(0);
  for (auto& th : pool) th.join();
  error.Set(backend_->Synchronize());
  return error.Get();
}

// The registered path: map and page-lock every span in place, then copy directly.
// A refused registration undoes what was done, sets stats.fallback and returns an
// error, and Run() goes staged instead.
Status CopyEngine::RunRegistered(const std::vector<Span>& spans, const std::vector<int>& fds,
                                 Direction dir, CopyStats& stats) {
  struct Map {
    void* base = nullptr;
    size_t length = 0;
    bool registered = false;
  };
  std::vector<Map> maps(spans.size());
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const bool read_only = dir == Direction::kHostToDevice;
  auto undo = [&]() {
    for (Map& m : maps) {
      if (m.registered) backend_->Unregister(m.base);
      if (m.base != nullptr) munmap(m.base, m.length);
    }
  };
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].bytes == 0) continue;
    uint64_t start = spans[i].offset / page * page;
    maps[i].length = spans[i].offset + spans[i].bytes - start;
    void* p = mmap(nullptr, maps[i].length, read_only ? PROT_READ : PROT_READ | PROT_WRITE,
                   MAP_SHARED, fds[i], static_cast<off_t>(start));
    if (p == MAP_FAILED) {
      stats.fallback = "mapping " + spans[i].path + ": " + ErrnoError("mmap", errno).message();
      maps[i].base = nullptr;
      undo();
      return Unavailable(stats.fallback);
    }
    maps[i].base = p;
    Status r = backend_->Register(p, maps[i].length, read_only);
    if (!r.ok()) {
      stats.fallback = "registering " + spans[i].path + ": " + r.message();
      undo();
      return Unavailable(stats.fallback);
    }
    maps[i].registered = true;
  }
  std::vector<Chunk> chunks = SplitChunks(spans, options_.chunk_bytes);
  stats.mode = "registered";
  stats.chunks = chunks.size();
  Status st;
  for (size_t k = 0; k < chunks.size() && st.ok(); ++k) {
    const Chunk& c = chunks[k];
    const Span& sp = spans[c.span];
    char* host = static_cast<char*>(maps[c.span].base) + (sp.offset % page) + c.offset;
    auto* dev = reinterpret_cast<char*>(static_cast<uintptr_t>(sp.device)) + c.offset;
    int stream = static_cast<int>(k % static_cast<size_t>(backend_->streams()));
    st = read_only ? backend_->CopyAsync(dev, host, c.bytes, dir, stream)
                   : backend_->CopyAsync(host, dev, c.bytes, dir, stream);
  }
  Status synced = backend_->Synchronize();
  if (st.ok()) st = synced;
  undo();
  stats.fallback.clear();
  return st;
}

Result<std::unique_ptr<CopyEngine>> MakeEngine(BackendOptions backend,
                                               const EngineOptions& options) {
  backend.events = std::max(backend.events, options.threads * options.slots);
  TP_ASSIGN_OR_RETURN(auto b, MakeBackend(backend));
  return CopyEngine::Make(std::move(b), options);
}

}  // namespace tenplex::device
