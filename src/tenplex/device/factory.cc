// MakeBackend: the CPU backend, or the CUDA one where it is built (TENPLEX_WITH_CUDA)
// and a device answers.
#include "tenplex/device/backend.h"

namespace tenplex::device {

#ifdef TENPLEX_WITH_CUDA
Result<std::unique_ptr<Backend>> MakeCudaBackend(const BackendOptions& options);  // cuda/
bool CudaBuilt() { return true; }
#else
bool CudaBuilt() { return false; }
#endif

Result<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options) {
  if (options.streams < 1 || options.streams > 64) {
    return InvalidArgument("device backend: streams must be 1..64, got " +
                           std::to_string(options.streams));
  }
  if (options.events < 1 || options.events > 4096) {
    return InvalidArgument("device backend: events must be 1..4096, got " +
                           std::to_string(options.events));
  }
  if (options.kind == "cpu") return MakeCpuBackend(options);
  if (options.kind != "cuda" && options.kind != "auto") {
    return InvalidArgument("device backend '" + options.kind + "': use cpu, cuda or auto");
  }
#ifdef TENPLEX_WITH_CUDA
  auto cuda = MakeCudaBackend(options);
  if (cuda.ok() || options.kind == "cuda") return cuda;
  return MakeCpuBackend(options);  // auto without a usable device
#else
  if (options.kind == "cuda") {
    return Unavailable(
        "device backend cuda: this build has no CUDA backend (configure with -DTENPLEX_CUDA=ON)");
  }
  return MakeCpuBackend(options);
#endif
}

}  // namespace tenplex::device
