// tenplex._tenplex.CopyEngine: the copy engine (tenplex/device/engine.h) for Python.
// Addresses are plain integers (a torch tensor's data_ptr()); calls release the GIL.
#include <pybind11/stl.h>

#include <memory>

#include "bindings.h"
#include "tenplex/device/engine.h"

namespace tenplex::py {
namespace {

using device::CopyEngine;
using device::Span;

pyb::dict StatsDict(const device::CopyStats& s) {
  pyb::dict d;
  d["bytes"] = s.bytes;
  d["chunks"] = s.chunks;
  d["seconds"] = s.seconds;
  d["gbps"] = s.seconds > 0 ? static_cast<double>(s.bytes) / s.seconds / 1e9 : 0.0;
  d["mode"] = s.mode;
  d["fallback"] = s.fallback;
  return d;
}

std::shared_ptr<CopyEngine> MakePyEngine(const std::string& backend, int device,
                                         uint64_t chunk_bytes, int slots, int streams, int threads,
                                         const std::string& mode) {
  device::BackendOptions b;
  b.kind = backend;
  b.device = device;
  b.streams = streams;
  device::EngineOptions o;
  o.chunk_bytes = chunk_bytes;
  o.slots = slots;
  if (threads > 0) o.threads = threads;  // else the engine's default (DefaultThreads)
  o.mode = Take(device::ParseMode(mode));
  Result<std::unique_ptr<CopyEngine>> r = Internal("copy engine: not made");
  {
    pyb::gil_scoped_release release;  // pinned allocations take a while
    r = device::MakeEngine(b, o);
  }
  return std::shared_ptr<CopyEngine>(Take(std::move(r)));
}

// Runs Restore or Commit over the spans without the GIL; its stats as a dict.
pyb::dict RunSpans(CopyEngine& e, const std::vector<Span>& spans,
                   Result<device::CopyStats> (CopyEngine::*run)(const std::vector<Span>&)) {
  Result<device::CopyStats> r = device::CopyStats{};
  {
    pyb::gil_scoped_release release;
    r = (e.*run)(spans);
  }
  return StatsDict(Take(std::move(r)));
}

}  // namespace

void register_device(pyb::module_& m) {
  const device::EngineOptions engine;  // the keyword defaults are the engine's
  const device::BackendOptions backend;
  m.def("cuda_built", &device::CudaBuilt, "Whether this module was built with the CUDA backend.");
  pyb::class_<CopyEngine, std::shared_ptr<CopyEngine>>(
      m, "CopyEngine",
      "Tensors between store files and device memory "
      "(docs/gpu.md).")
      .def(pyb::init(&MakePyEngine), pyb::arg("backend") = backend.kind, pyb::arg("device") = 0,
           pyb::arg("chunk_bytes") = engine.chunk_bytes, pyb::arg("slots") = engine.slots,
           pyb::arg("streams") = backend.streams, pyb::arg("threads") = 0,
           pyb::arg("mode") = "auto")
      .def_property_readonly("backend", [](CopyEngine& e) { return e.backend().name(); })
      .def_property_readonly("description", [](CopyEngine& e) { return e.backend().description(); })
      .def(
          "restore",
          [](CopyEngine& e,
             const std::vector<std::tuple<std::string, uint64_t, uint64_t, uint64_t>>& items) {
            std::vector<Span> spans;
            for (const auto& [path, offset, bytes, dst] : items)
              spans.push_back(Span{path, offset, bytes, dst});
            return RunSpans(e, spans, &CopyEngine::Restore);
          },
          pyb::arg("items"),
          "[(file, offset, nbytes, device address)] into device memory; complete on return.")
      .def(
          "commit",
          [](CopyEngine& e,
             const std::vector<std::tuple<uint64_t, std::string, uint64_t, uint64_t>>& items) {
            std::vector<Span> spans;
            for (const auto& [src, path, offset, bytes] : items)
              spans.push_back(Span{path, offset, bytes, src});
            return RunSpans(e, spans, &CopyEngine::Commit);
          },
          pyb::arg("items"),
          "[(device address, file, offset, nbytes)] into the files; complete on return.");
}

}  // namespace tenplex::py
