// The CUDA backend (backend.h) over CUDA's runtime API: cudaHostAlloc'd staging,
// cudaHostRegister of existing mappings, cudaMemcpyAsync on non-blocking streams, and
// events. It shares the device's primary context with every other runtime user in the
// process (PyTorch's allocations are valid here). Built with -DTENPLEX_CUDA=ON.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "tenplex/device/backend.h"

namespace tenplex::device {
namespace {

Status CudaError(const std::string& what, cudaError_t e) {
  std::string msg =
      "cuda: " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  if (e == cudaErrorMemoryAllocation || e == cudaErrorHostMemoryAlreadyRegistered) {
    return ResourceExhausted(msg);
  }
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return Unavailable(msg);
  if (e == cudaErrorInvalidValue) return InvalidArgument(msg);
  return Internal(msg);
}

class CudaBackend : public Backend {
 public:
  ~CudaBackend() override {
    cudaSetDevice(device_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }
  static Result<std::unique_ptr<Backend>> Make(const BackendOptions& o) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return CudaError("counting devices", e);
    if (o.device < 0 || o.device >= count) {
      return Unavailable("cuda: no device " + std::to_string(o.device) + " (" +
                         std::to_string(count) + " present)");
    }
    auto b = std::unique_ptr<CudaBackend>(new CudaBackend());
    b->device_ = o.device;
    if ((e = cudaSetDevice(o.device)) != cudaSuccess) return CudaError("setting the device", e);
    cudaDeviceProp prop{};
    if ((e = cudaGetDeviceProperties(&prop, o.device)) != cudaSuccess)
      return CudaError("device properties", e);
    b->description_ = std::string(prop.name) + " (cuda:" + std::to_string(o.device) + ")";
    int ro = 0;
    cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, o.device);
    b->read_only_registration_ = ro != 0;
    for (int i = 0; i < o.streams; ++i) {
      cudaStream_t s;
      if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
        return CudaError("stream", e);
      b->streams_.push_back(s);
    }
    for (int i = 0; i < o.events; ++i) {
      cudaEvent_t ev;
      if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess)
        return CudaError("event", e);
      b->events_.push_back(ev);
    }
    b->recorded_.assign(b->events_.size(), 0);
    return std::unique_ptr<Backend>(std::move(b));
  }

  std::string name() const override { return "cuda"; }
  std::string description() const override { return description_; }
  int streams() const override { return static_cast<int>(streams_.size()); }
  int events() const override { return static_cast<int>(events_.size()); }
  Status BindThread() override {
    cudaError_t e = cudaSetDevice(device_);
    return e == cudaSuccess ? Status::Ok() : CudaError("setting the device", e);
  }

  Result<void*> AllocPinned(size_t bytes) override {
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess)
      return CudaError("pinned allocation of " + std::to_string(bytes) + " bytes", e);
    return p;
  }
  void FreePinned(void* p) override { cudaFreeHost(p); }
  Result<void*> AllocDevice(size_t bytes) override {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
      return CudaError("device allocation of " + std::to_string(bytes) + " bytes", e);
    return p;
  }
  void FreeDevice(void* p) override { cudaFree(p); }
  Status Register(void* p, size_t bytes, bool read_only) override {
    if (read_only && !read_only_registration_) {
      return Unavailable("cuda: this device cannot register read-only mappings");
    }
    unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    cudaError_t e = cudaHostRegister(p, bytes, flags);
    if (e != cudaSuccess) {
      cudaGetLastError();  // a refused registration is not sticky; clear it
      return CudaError("registering " + std::to_string(bytes) + " bytes of a mapping", e);
    }
    return Status::Ok();
  }
  void Unregister(void* p) override { cudaHostUnregister(p); }

  Status CopyAsync(void* dst, const void* src, size_t bytes, Direction dir, int stream) override {
    if (stream < 0 || stream >= streams())
      return InvalidArgument("copy: no stream " + std::to_string(stream));
    cudaMemcpyKind kind =
        dir == Direction::kHostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, streams_[static_cast<size_t>(stream)]);
    return e == cudaSuccess ? Status::Ok()
                            : CudaError("copy of " + std::to_string(bytes) + " bytes", e);
  }
  Status RecordEvent(int event, int stream) override {
    if (event < 0 || event >= events())
      return InvalidArgument("event " + std::to_string(event) + " out of range");
    if (stream < 0 || stream >= streams())
      return InvalidArgument("record: no stream " + std::to_string(stream));
    cudaError_t e =
        cudaEventRecord(events_[static_cast<size_t>(event)], streams_[static_cast<size_t>(stream)]);
    if (e != cudaSuccess) return CudaError("recording an event", e);
    recorded_[static_cast<size_t>(event)] = 1;  // each event is owned by one engine thread
    return Status::Ok();
  }
  Status WaitEvent(int event) override {
    if (event < 0 || event >= events())
      return InvalidArgument("event " + std::to_string(event) + " out of range");
    if (!recorded_[static_cast<size_t>(event)]) return Status::Ok();
    cudaError_t e = cudaEventSynchronize(events_[static_cast<size_t>(event)]);
    return e == cudaSuccess ? Status::Ok() : CudaError("waiting for copies", e);
  }
  Status Synchronize() override {
    for (cudaStream_t s : streams_) {
      cudaError_t e = cudaStreamSynchronize(s);
      if (e != cudaSuccess) return CudaError("waiting for the streams", e);
    }
    return Status::Ok();
  }

 private:
  CudaBackend() = default;
  int device_ = 0;
  std::string description_;
  bool read_only_registration_ = false;
  std::vector<cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_;
  std::vector<uint8_t> recorded_;  // per event, written only by its owner thread (no bit packing)
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeCudaBackend(const BackendOptions& options) {
  return CudaBackend::Make(options);
}

}  // namespace tenplex::device
