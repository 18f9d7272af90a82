// The one interface to an accelerator that the copy engine (engine.h) needs: page-locked
// host memory, registration of existing host mappings, asynchronous copies on streams,
// and events that a host thread can wait for.
//
// Two implementations: the CPU backend (always built) and the CUDA backend (built with
// -DTENPLEX_CUDA=ON). On the CPU backend "device memory" is ordinary host memory, each
// stream is a worker thread that runs its queued copies in order, and an event is a
// position in a stream's queue; so the engine's chunking, overlap, fallback and error
// paths run unchanged, and are tested, on machines without a GPU. It can inject faults
// (a failing registration, a failing copy) for those tests.
//
// Threads: every method may be called from several threads at once. A thread that
// calls into the CUDA backend first calls BindThread() (the current device is
// per-thread state in CUDA's runtime).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tenplex/util/status.h"

namespace tenplex::device {

enum class Direction { kHostToDevice, kDeviceToHost };

class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu" or "cuda".
  virtual std::string name() const = 0;
  // What runs it, e.g. "NVIDIA H200 (cuda:0)".
  virtual std::string description() const = 0;
  virtual int streams() const = 0;
  virtual int events() const = 0;
  virtual Status BindThread() = 0;

  // Page-locked host memory, for staging; FreePinned releases it.
  virtual Result<void*> AllocPinned(size_t bytes) = 0;
  virtual void FreePinned(void* p) = 0;
  // Device memory (the CPU backend's is host memory); for tests and benchmarks, the
  // engine itself only copies into memory its caller owns (e.g. PyTorch's).
  virtual Result<void*> AllocDevice(size_t bytes) = 0;
  virtual void FreeDevice(void* p) = 0;
  // Page-locks [p, p + bytes) of an existing mapping so that copies use it directly
  // (read_only: the mapping is PROT_READ). Fails where the kernel or the memlock
  // limit refuses; the caller falls back to staging.
  virtual Status Register(void* p, size_t bytes, bool read_only) = 0;
  virtual void Unregister(void* p) = 0;

  // Queues a copy of bytes on stream s (0 <= s < streams()); it runs after the work
  // queued on s before it. Errors of the copy itself may only show at a later Wait.
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes, Direction dir, int stream) = 0;
  // Event e (0 <= e < events()) marks the current end of stream s; WaitEvent blocks
  // the calling thread until everything queued on that stream before the mark is done,
  // and returns the first error of that work. A never-recorded event is done.
  virtual Status RecordEvent(int event, int stream) = 0;
  virtual Status WaitEvent(int event) = 0;
  // Waits for all streams; returns the first error not yet reported.
  virtual Status Synchronize() = 0;
};

struct BackendOptions {
  std::string kind = "auto";  // "cpu", "cuda", or "auto": cuda when built and a device exists
  int device = 0;             // the CUDA device index
  int streams = 2;
  int events = 8;
  // CPU backend only, for tests: Register fails; the copy with this 1-based index fails.
  bool cpu_fail_register = false;
  uint64_t cpu_fail_copy = 0;
};

// Whether this build has the CUDA backend.
bool CudaBuilt();
Result<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options);
// The CPU backend alone (the factory uses it for kind "cpu").
std::unique_ptr<Backend> MakeCpuBackend(const BackendOptions& options);

}  // namespace tenplex::device
