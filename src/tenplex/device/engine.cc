#include "tenplex/device/engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <thread>

#include "tenplex/util/file.h"
#include "tenplex/util/thread_pool.h"

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

int DefaultThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) * 3 / 4, 2, 16);
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
    // A refusal: all over again staged (every byte is written again, so a half-done
    // registered pass leaves nothing behind).
    if (!st.ok() && !stats.fallback.empty()) st = RunStaged(spans, files.fds(), dir, stats);
  } else {
    st = RunStaged(spans, files.fds(), dir, stats);
  }
  TP_RETURN_IF_ERROR(st);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

// The pipeline both paths share. Worker t takes every threads-th chunk; a chunk is
// issued on slot t * slots + i (its event) and completed once the slot comes round
// again (or at the end): complete waits for the slot's event, then runs `done`. So each
// worker keeps up to `slots` chunks in flight, and the workers' streams overlap.
Status CopyEngine::RunPipeline(const std::vector<Chunk>& chunks, const IssueFn& issue,
                               const DoneFn& done) {
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
      Status d = done(*c, slot, s.ok() && !error.failed());
      error.Set(s.ok() ? d : s);
    };
    int next = 0;
    for (size_t k = static_cast<size_t>(t); k < chunks.size() && !error.failed();
         k += static_cast<size_t>(threads)) {
      if (static_cast<int>(inflight.size()) == options_.slots) complete();
      const int slot = t * options_.slots + next;
      next = (next + 1) % options_.slots;
      bool issued = false;
      Status s = issue(chunks[k], slot, stream, issued);
      if (s.ok()) s = backend_->RecordEvent(slot, stream);
      error.Set(s);
      if (issued) inflight.emplace_back(&chunks[k], slot);  // its done() must run
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

// Staged: restore reads the chunk into the slot's pinned buffer and queues its copy to
// the device; commit queues the copy into the buffer and writes it to the file when done.
Status CopyEngine::RunStaged(const std::vector<Span>& spans, const std::vector<int>& fds,
                             Direction dir, CopyStats& stats) {
  std::vector<Chunk> chunks = SplitChunks(spans, options_.chunk_bytes);
  stats.mode = ModeName(Mode::kStaged);
  stats.chunks = chunks.size();
  auto issue = [&](const Chunk& c, int slot, int stream, bool& issued) {
    const Span& sp = spans[c.span];
    void* buf = slots_[static_cast<size_t>(slot)];
    auto* dev = reinterpret_cast<char*>(static_cast<uintptr_t>(sp.device)) + c.offset;
    Status s;
    if (dir == Direction::kHostToDevice) {
      s = PreadExact(fds[c.span], buf, c.bytes, sp.offset + c.offset, sp.path);
      if (s.ok()) s = backend_->CopyAsync(dev, buf, c.bytes, dir, stream);
    } else {
      s = backend_->CopyAsync(buf, dev, c.bytes, dir, stream);
    }
    issued = s.ok();
    return s;
  };
  auto done = [&](const Chunk& c, int slot, bool ok) {
    if (!ok || dir == Direction::kHostToDevice) return Status::Ok();
    const Span& sp = spans[c.span];
    return PwriteExact(fds[c.span], slots_[static_cast<size_t>(slot)], c.bytes,
                       sp.offset + c.offset, sp.path);
  };
  return RunPipeline(chunks, issue, done);
}

// Registered: every span's file is mapped (cheap: no page is touched), and each chunk
// is page-locked in place just before its copy and unlocked after it, in the pipeline:
// locking chunk k+1 overlaps the DMA of chunk k, and the workers lock in parallel. A
// refused registration (or a span that does not start on a page) sets stats.fallback
// and returns an error once the queued copies drained; Run() then goes staged.
Status CopyEngine::RunRegistered(const std::vector<Span>& spans, const std::vector<int>& fds,
                                 Direction dir, CopyStats& stats) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const bool read_only = dir == Direction::kHostToDevice;
  std::vector<std::pair<void*, size_t>> maps(spans.size(), {nullptr, 0});
  auto unmap = [&]() {
    for (auto& [base, length] : maps)
      if (base != nullptr) munmap(base, length);
  };
  for (size_t i = 0; i < spans.size(); ++i) {
    if (spans[i].bytes == 0) continue;
    if (spans[i].offset % page != 0 || options_.chunk_bytes % page != 0) {
      stats.fallback = spans[i].path + ": the span or the chunk size is not page-aligned";
      unmap();
      return Unavailable(stats.fallback);
    }
    void* p = mmap(nullptr, spans[i].bytes, read_only ? PROT_READ : PROT_READ | PROT_WRITE,
                   MAP_SHARED, fds[i], static_cast<off_t>(spans[i].offset));
    if (p == MAP_FAILED) {
      stats.fallback = "mapping " + spans[i].path + ": " + ErrnoError("mmap", errno).message();
      unmap();
      return Unavailable(stats.fallback);
    }
    maps[i] = {p, spans[i].bytes};
  }
  std::vector<Chunk> chunks = SplitChunks(spans, options_.chunk_bytes);
  stats.mode = ModeName(Mode::kRegistered);
  stats.chunks = chunks.size();
  std::mutex refused_mu;
  std::string refused;
  auto host = [&](const Chunk& c) { return static_cast<char*>(maps[c.span].first) + c.offset; };
  auto issue = [&](const Chunk& c, int /*slot*/, int stream, bool& issued) {
    Status r = backend_->Register(host(c), c.bytes, read_only);
    if (!r.ok()) {
      std::lock_guard<std::mutex> l(refused_mu);
      if (refused.empty()) refused = "registering " + spans[c.span].path + ": " + r.message();
      return Unavailable(refused);
    }
    issued = true;  // registered: done() unregisters it, whatever the copy does
    auto* dev = reinterpret_cast<char*>(static_cast<uintptr_t>(spans[c.span].device)) + c.offset;
    return read_only ? backend_->CopyAsync(dev, host(c), c.bytes, dir, stream)
                     : backend_->CopyAsync(host(c), dev, c.bytes, dir, stream);
  };
  auto done = [&](const Chunk& c, int /*slot*/, bool /*ok*/) {
    backend_->Unregister(host(c));
    return Status::Ok();
  };
  Status st = RunPipeline(chunks, issue, done);
  unmap();
  if (!refused.empty()) stats.fallback = refused;
  return st;
}

Result<std::unique_ptr<CopyEngine>> MakeEngine(BackendOptions backend,
                                               const EngineOptions& options) {
  backend.events = std::max(backend.events, options.threads * options.slots);
  TP_ASSIGN_OR_RETURN(auto b, MakeBackend(backend));
  return CopyEngine::Make(std::move(b), options);
}

}  // namespace tenplex::device
