// tenplex._tenplex.CopyEngine: the copy engine (tenplex/device/engine.h) for Python.
// Addresses are plain integers (a torch tensor's data_ptr()); calls release the GIL.
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <thread>

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
  // 0: three quarters of the cores, 2..16. Each worker's pread runs at a few GB/s and a
  // PCIe Gen5 link takes ~55 GB/s: on an H200 host (16 cores) 12-16 workers with 1-2 MiB
  // chunks reached 0.63-0.65 of the pinned limit, 8 workers with 8 MiB chunks 0.33
  // (docs/gpu.md). A restore runs while the job waits, so the cores are free.
  o.threads =
      threads > 0
          ? threads
          : std::clamp(static_cast<int>(std::thread::hardware_concurrency()) * 3 / 4, 2, 16);
  o.mode = Take(device::ParseMode(mode));
  std::unique_ptr<CopyEngine> e;
  {
    pyb::gil_scoped_release release;
    auto r = device::MakeEngine(b, o);
    if (!r.ok()) {
      pyb::gil_scoped_acquire acquire;
      Check(r.status());
    }
    e = std::move(r).value();
  }
  return std::shared_ptr<CopyEngine>(std::move(e));
}

}  // namespace

void register_device(pyb::module_& m) {
  m.def("cuda_built", &device::CudaBuilt, "Whether this module was built with the CUDA backend.");
  pyb::class_<CopyEngine, std::shared_ptr<CopyEngine>>(
      m, "CopyEngine",
      "Tensors between store files and device memory "
      "(docs/gpu.md).")
      .def(pyb::init(&MakePyEngine), pyb::arg("backend") = "auto", pyb::arg("device") = 0,
           pyb::arg("chunk_bytes") = 2ull << 20, pyb::arg("slots") = 3, pyb::arg("streams") = 2,
           pyb::arg("threads") = 0, pyb::arg("mode") = "auto")
      .def_property_readonly("backend", [](CopyEngine& e) { return e.backend().name(); })
      .def_property_readonly("description", [](CopyEngine& e) { return e.backend().description(); })
      .def(
          "restore",
          [](CopyEngine& e,
             const std::vector<std::tuple<std::string, uint64_t, uint64_t, uint64_t>>& items) {
            std::vector<Span> spans;
            for (const auto& [path, offset, bytes, dst] : items)
              spans.push_back(Span{path, offset, bytes, dst});
            Result<device::CopyStats> r = device::CopyStats{};
            {
              pyb::gil_scoped_release release;
              r = e.Restore(spans);
            }
            return StatsDict(Take(std::move(r)));
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
            Result<device::CopyStats> r = device::CopyStats{};
            {
              pyb::gil_scoped_release release;
              r = e.Commit(spans);
            }
            return StatsDict(Take(std::move(r)));
          },
          pyb::arg("items"),
          "[(device address, file, offset, nbytes)] into the files; complete on return.");
}

}  // namespace tenplex::py
