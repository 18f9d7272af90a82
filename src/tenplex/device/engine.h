// The copy engine: tensors between the store's shared-memory files and device memory,
// chunked and overlapped, with the host side in page-locked memory.
//
// A restore reads spans (file, offset, bytes) into device addresses; a commit writes
// device addresses into spans of files. Two ways to do it:
//
// * staged (the default): a ring of page-locked slots of chunk_bytes per worker thread.
//   Each of `threads` workers takes every threads-th chunk; for a restore it pread()s
//   the chunk into a free slot and queues the slot's host-to-device copy on its stream,
//   for a commit it queues the device-to-host copy into a slot and, once the slot's
//   event says it landed, pwrite()s it into the file. A slot is reused only after its
//   event, so each worker keeps up to `slots` chunks in flight: reading chunk k+1 from
//   the file overlaps the DMA of chunk k, and the workers' streams overlap each other.
//   No pageable buffer sits between the file and the device: the kernel copies the
//   tmpfs pages straight into the pinned slot, and the DMA engine reads the slot.
// * registered: every span's file range is mapped, and each chunk is page-locked in
//   place (cudaHostRegister, read-only for a restore) just before its copy and
//   unlocked after it, in the same pipeline: no host copy at all, and locking chunk k+1
//   overlaps the DMA of chunk k. Locking pages costs about as much per byte as a copy
//   (a whole 16 GB state locked up front ran at 12 GB/s on an H200 host, against 31 GB/s
//   staged), which the pipeline hides only where locking runs in parallel. When the
//   kernel, the memlock limit or an unaligned span refuses it, the call runs again
//   staged and says why (stats.fallback).
//
// Chunks never cross spans: a span of n bytes is ceil(n / chunk_bytes) chunks, all
// full but the last (SplitChunks). Every file is opened, checked to be a regular file
// long enough, before any byte moves, so a bad span fails the call cleanly; an error
// in flight (a short read, a failed copy) stops every worker at its next chunk, and the
// call returns the first error after all queued copies have drained.
//
// The same engine runs over the CPU backend in the tests: same chunking, same overlap,
// same fallback and errors, with memcpy in place of DMA.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "tenplex/device/backend.h"
#include "tenplex/util/status.h"

namespace tenplex::device {

// A tensor's bytes: `bytes` at `offset` of file `path`, and the device address that
// holds (restore: receives; commit: provides) them.
struct Span {
  std::string path;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t device = 0;
};

// One copy: bytes [offset, offset + bytes) of span `span`.
struct Chunk {
  size_t span = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

enum class Mode { kAuto, kStaged, kRegistered };
Result<Mode> ParseMode(std::string_view text);
std::string_view ModeName(Mode mode);

// The default worker count: three quarters of the cores, 2..16. Each worker's pread runs
// at a few GB/s and a PCIe Gen5 link takes ~55 GB/s: on an H200 host (16 cores) 12-16
// workers with 1-2 MiB chunks reached 0.63-0.65 of the pinned limit, 8 workers with
// 8 MiB chunks 0.33 (docs/gpu.md). A restore runs while the job waits: the cores are free.
int DefaultThreads();

struct EngineOptions {
  uint64_t chunk_bytes = 2ull << 20;  // small: the ring stays in the CPU's cache
  int slots = 3;                      // page-locked slots per worker thread (at least 2 overlap)
  int threads = DefaultThreads();     // worker threads of the pipeline
  Mode mode = Mode::kAuto;
};

struct CopyStats {
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  double seconds = 0;
  std::string mode;      // "staged" or "registered"
  std::string fallback;  // why registered fell back to staged, or empty
};

// The chunks of spans in order (zero-byte spans have none).
std::vector<Chunk> SplitChunks(const std::vector<Span>& spans, uint64_t chunk_bytes);

class CopyEngine {
 public:
  // Allocates threads * slots page-locked slots of chunk_bytes on the backend, whose
  // events() must be at least threads * slots (MakeEngine below sizes it).
  static Result<std::unique_ptr<CopyEngine>> Make(std::unique_ptr<Backend> backend,
                                                  const EngineOptions& options);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Files into device memory; every copy is complete on return.
  Result<CopyStats> Restore(const std::vector<Span>& spans);
  // Device memory into files; the bytes are in the files on return.
  Result<CopyStats> Commit(const std::vector<Span>& spans);

  Backend& backend() { return *backend_; }
  const EngineOptions& options() const { return options_; }

 private:
  CopyEngine(std::unique_ptr<Backend> backend, const EngineOptions& options);
  Result<CopyStats> Run(const std::vector<Span>& spans, Direction dir);
  // issue(chunk, slot, stream, issued&): queue the chunk's work (issued = done() must
  // run for it); done(chunk, slot, ok): after the slot's event (ok: no error so far).
  using IssueFn = std::function<Status(const Chunk&, int, int, bool&)>;
  using DoneFn = std::function<Status(const Chunk&, int, bool)>;
  Status RunPipeline(const std::vector<Chunk>& chunks, const IssueFn& issue, const DoneFn& done);
  Status RunStaged(const std::vector<Span>& spans, const std::vector<int>& fds, Direction dir,
                   CopyStats& stats);
  Status RunRegistered(const std::vector<Span>& spans, const std::vector<int>& fds, Direction dir,
                       CopyStats& stats);

  std::unique_ptr<Backend> backend_;
  EngineOptions options_;
  std::vector<void*> slots_;
  std::mutex mu_;  // one call at a time
};

// A backend and an engine of matching sizes: backend.kind "cpu", "cuda" or "auto".
Result<std::unique_ptr<CopyEngine>> MakeEngine(BackendOptions backend,
                                               const EngineOptions& options);

}  // namespace tenplex::device
