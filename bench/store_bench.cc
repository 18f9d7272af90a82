// Store throughput, each figure as a ratio to memcpy measured in the same run.
//
//   store_bench [--mib N (default 256)] [--reps R (default 5)] [--shm-dir DIR]
//
// --shm-dir puts the stores' directories under DIR (removed at the end), e.g. on a
// tmpfs mounted with huge=within_size to compare huge pages (docs/store.md).
//
// A store and its HTTP server run in this process on a loopback port; the client is
// the real store::Client, so local transfers take the same shared-memory paths as
// `tenplex store load/save` and a training process. Every figure is the best of R
// repetitions (GB/s = 1e9 bytes/s). The baselines:
//   memcpy        the parallel copy the store uses (same threads) between two private,
//                 pre-faulted buffers;
//   memcpy fresh  the same copy into freshly malloc'ed memory (page faults included):
//                 what creating new state costs any process.
// Local put creates a new tensor (allocation request, fallocate, pwrite); local get
// preads a tensor into a pre-faulted buffer; "mapped" rows copy through a map the
// process already holds (the steady state of a training process that maps its state).
// HTTP rows move bodies through cpp-httplib on loopback.
// "new version" rows write a whole new version (8 tensors, the same bytes in all) the
// way a transform does in the daemon (Store::Allocate, Prefault, memcpy through the
// store's map) or a loader does (Store::Put, pwrite), each version committed and the
// one before released: with the page pool off every version lands in fresh pages; with
// it on (docs/store.md) in the pages of the version released before.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tenplex/store/client.h"
#include "tenplex/store/server.h"
#include "tenplex/store/store.h"

namespace ts = tenplex::store;
using tenplex::DType;
using tenplex::Status;

namespace {

double Best(int reps, const std::function<void()>& setup, const std::function<void()>& op) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    if (setup) setup();
    auto t0 = std::chrono::steady_clock::now();
    op();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "store_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
T Take(tenplex::Result<T> r, const char* what) {
  Check(r.status(), what);
  return std::move(r).value();
}

struct VersionTimes {
  double map_write = 1e30, put = 1e30;
};

// Best time to write a new version of `parts` tensors holding `src`, through maps and
// through Put, with the page pool off or on; every written version is checked.
VersionTimes NewVersions(const std::vector<uint8_t>& src, int parts, int reps, bool pool,
                         const std::string& root) {
  ts::StoreOptions o;
  if (!root.empty()) o.shm_dir = root + (pool ? "/pooled" : "/fresh");
  o.page_pool_bytes = pool ? 4 * src.size() : 0;
  auto store = Take(ts::Store::Open(o), "open store");
  const uint64_t part = src.size() / static_cast<uint64_t>(parts);
  const tenplex::Shape shape{static_cast<int64_t>(part / 4)};
  VersionTimes best;
  // Two versions first, so that the measured ones find the pool filled.
  for (int r = 0; r < reps + 2; ++r) {
    for (bool put : {false, true}) {
      const uint64_t v = Take(store->BeginVersion("bench"), "begin");
      auto path = [&](int i) {
        return "jobs/bench/" + std::to_string(v) + "/rank-00000/t" + std::to_string(i);
      };
      auto t0 = std::chrono::steady_clock::now();
      if (put) {
        for (int i = 0; i < parts; ++i) {
          Take(store->Put(path(i), DType::kF32, shape, src.data() + i * part, part), "put");
        }
      } else {
        std::vector<ts::TensorWriter> ws;
        for (int i = 0; i < parts; ++i)
          ws.push_back(Take(store->Allocate(path(i), DType::kF32, shape), "allocate"));
        for (const auto& w : ws) w.Prefault();
        for (int i = 0; i < parts; ++i)
          ts::ParallelMemcpy(ws[i].data(), src.data() + i * part, part);
      }
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (int i = 0; i < parts; ++i) {
        auto ref = Take(store->Get(path(i)), "get");
        if (std::memcmp(ref.data(), src.data() + i * part, part) != 0) {
          std::fprintf(stderr, "store_bench: a new version holds other bytes\n");
          std::exit(1);
        }
      }
      Check(store->Commit("bench", v), "commit");
      if (r >= 2) (put ? best.put : best.map_write) = std::min(put ? best.put : best.map_write, t);
    }
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 256;
  int reps = 5;
  std::string root;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--shm-dir") root = argv[i + 1];
    if (std::string(argv[i]) == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
  }
  const uint64_t n = mib << 20;
  const int64_t cols = 8192, rows = static_cast<int64_t>(n / 4 / cols);
  const uint64_t bytes = static_cast<uint64_t>(rows * cols * 4);

  ts::StoreOptions so;
  if (!root.empty()) so.shm_dir = root + "/main";
  auto store = Take(ts::Store::Open(so), "open store");
  ts::Server server(*store,
                    {.token = "", .max_body_bytes = 2 * bytes, .max_header_bytes = 16 << 10});
  const int port = Take(server.Bind("127.0.0.1", 0), "bind");
  std::thread serving([&] { Check(server.Serve(), "serve"); });
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto client = Take(ts::Client::Connect(url), "connect");
  if (!client->local()) {
    std::fprintf(stderr, "store_bench: the client does not see the store's shared memory\n");
    return 1;
  }
  const uint64_t v = Take(client->BeginVersion("bench"), "begin");
  const std::string prefix = "jobs/bench/" + std::to_string(v) + "/rank-00000/";
  const tenplex::Shape shape{rows, cols};

  std::vector<uint8_t> src(bytes), dst(bytes);
  for (uint64_t i = 0; i < bytes; ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  std::memset(dst.data(), 1, bytes);

  struct Row {
    std::string name;
    double seconds;
    uint64_t bytes;
    double vs;  // baseline seconds for the ratio
    std::string baseline;
  };
  std::vector<Row> out;

  const double t_memcpy =
      Best(reps, nullptr, [&] { ts::ParallelMemcpy(dst.data(), src.data(), bytes); });
  const double t_fresh = Best(reps, nullptr, [&] {
    void* p = std::malloc(bytes);
    ts::ParallelMemcpy(p, src.data(), bytes);
    std::free(p);
  });
  out.push_back({"memcpy (pre-faulted)", t_memcpy, bytes, t_memcpy, "memcpy"});
  out.push_back({"memcpy into fresh malloc", t_fresh, bytes, t_memcpy, "memcpy"});

  // Local put: a new tensor each time (the previous one is replaced and released).
  const double t_put = Best(reps, nullptr, [&] {
    Check(client->Write(prefix + "put", DType::kF32, shape, src.data(), bytes), "local put");
  });
  auto put_info = Take(client->List(prefix + "put"), "list")[0];
  const double t_get =
      Best(reps, nullptr, [&] { Check(client->Read(put_info, dst.data()), "local get"); });
  if (std::memcmp(dst.data(), src.data(), bytes) != 0) {
    std::fprintf(stderr, "store_bench: local get returned other bytes\n");
    return 1;
  }
  out.push_back({"local put (alloc + pwrite, new tensor)", t_put, bytes, t_memcpy, "memcpy"});
  out.push_back({"local put (alloc + pwrite, new tensor)", t_put, bytes, t_fresh, "memcpy fresh"});
  out.push_back({"local get (pread)", t_get, bytes, t_memcpy, "memcpy"});

  // Zero-copy: map a new tensor and write it; map a tensor and read it.
  const double t_map_put = Best(reps, nullptr, [&] {
    auto infos = Take(client->Allocate({{prefix + "mapped", DType::kF32, shape}}), "alloc");
    auto m = Take(ts::Client::Map(infos[0], /*writable=*/true, /*populate=*/true), "map");
    ts::ParallelMemcpy(m.data(), src.data(), bytes);
  });
  const double t_map_get = Best(reps, nullptr, [&] {
    auto info = Take(client->ShmInfo(prefix + "mapped"), "shm info");
    auto m = Take(ts::Client::Map(info, /*writable=*/false, /*populate=*/true), "map");
    ts::ParallelMemcpy(dst.data(), m.data(), bytes);
  });
  out.push_back({"map new tensor + write", t_map_put, bytes, t_memcpy, "memcpy"});
  out.push_back({"map tensor + read", t_map_get, bytes, t_memcpy, "memcpy"});
  {
    auto info = Take(client->ShmInfo(prefix + "mapped"), "shm info");
    auto m = Take(ts::Client::Map(info, /*writable=*/true, /*populate=*/true), "map");
    ts::ParallelMemcpy(m.data(), src.data(), bytes);  // touch once
    const double t_w =
        Best(reps, nullptr, [&] { ts::ParallelMemcpy(m.data(), src.data(), bytes); });
    const double t_r =
        Best(reps, nullptr, [&] { ts::ParallelMemcpy(dst.data(), m.data(), bytes); });
    out.push_back({"mapped write (map held)", t_w, bytes, t_memcpy, "memcpy"});
    out.push_back({"mapped read (map held)", t_r, bytes, t_memcpy, "memcpy"});
  }

  // New versions into fresh and into pooled pages.
  const VersionTimes fresh = NewVersions(src, 8, reps, /*pool=*/false, root);
  const VersionTimes pooled = NewVersions(src, 8, reps, /*pool=*/true, root);
  out.push_back(
      {"new version, map + write, fresh pages", fresh.map_write, bytes, t_memcpy, "memcpy"});
  out.push_back(
      {"new version, map + write, pooled pages", pooled.map_write, bytes, t_memcpy, "memcpy"});
  out.push_back({"new version, map + write, pooled pages", pooled.map_write, bytes, fresh.map_write,
                 "fresh pages"});
  out.push_back({"new version, Put (pwrite), fresh pages", fresh.put, bytes, t_memcpy, "memcpy"});
  out.push_back({"new version, Put (pwrite), pooled pages", pooled.put, bytes, t_memcpy, "memcpy"});
  out.push_back(
      {"new version, Put (pwrite), pooled pages", pooled.put, bytes, fresh.put, "fresh pages"});

  // HTTP bodies.
  auto http = Take(ts::Client::Connect(url, {.token = "", .use_shm = false}), "connect http");
  const double t_hput = Best(reps, nullptr, [&] {
    Check(http->Put(prefix + "http", DType::kF32, shape, src.data(), bytes).status(), "http put");
  });
  const double t_hget = Best(reps, nullptr, [&] {
    Check(http->GetInto(prefix + "http", "", dst.data(), bytes), "http get");
  });
  const std::string half = std::to_string(rows / 2);
  const uint64_t half_bytes = static_cast<uint64_t>(rows / 2 * cols * 4);
  const double t_rows = Best(reps, nullptr, [&] {
    Check(http->GetInto(prefix + "http", "0:" + half, dst.data(), half_bytes), "http rows");
  });
  const uint64_t col_bytes = static_cast<uint64_t>(rows * (cols / 2) * 4);
  const double t_cols = Best(reps, nullptr, [&] {
    Check(http->GetInto(prefix + "http", ":,0:" + std::to_string(cols / 2), dst.data(), col_bytes),
          "http cols");
  });
  out.push_back({"HTTP PUT body", t_hput, bytes, t_memcpy, "memcpy"});
  out.push_back({"HTTP GET whole tensor", t_hget, bytes, t_memcpy, "memcpy"});
  out.push_back(
      {"HTTP GET range rows 0:" + half + " (contiguous)", t_rows, half_bytes, t_memcpy, "memcpy"});
  out.push_back({"HTTP GET range :,0:" + std::to_string(cols / 2) + " (strided)", t_cols, col_bytes,
                 t_memcpy, "memcpy"});

  std::printf("store_bench: %s per tensor ([%lld, %lld] F32), best of %d, %u threads\n",
              (std::to_string(bytes >> 20) + " MiB").c_str(), static_cast<long long>(rows),
              static_cast<long long>(cols), reps, std::thread::hardware_concurrency());
  std::printf("%-46s %9s %9s  %s\n", "operation", "GB/s", "ratio", "to");
  for (const Row& r : out) {
    const double gbs = static_cast<double>(r.bytes) / r.seconds / 1e9;
    const double base = static_cast<double>(r.bytes) / r.vs / 1e9;
    std::printf("%-46s %9.2f %9.2f  %s\n", r.name.c_str(), gbs, gbs / base, r.baseline.c_str());
  }
  const double get_ratio = t_memcpy / t_get, put_ratio = t_memcpy / t_put;
  std::printf(
      "goal: local get/memcpy %.2f (>= 0.8: %s), local put/memcpy %.2f (>= 0.8: %s), put/fresh "
      "memcpy %.2f\n",
      get_ratio, get_ratio >= 0.8 ? "met" : "NOT met", put_ratio,
      put_ratio >= 0.8 ? "met" : "NOT met", t_fresh / t_put);
  server.Stop();
  serving.join();
  if (!root.empty()) {
    store.reset();
    std::error_code ec;
    for (const char* d : {"/main", "/fresh", "/pooled"}) std::filesystem::remove_all(root + d, ec);
  }
  return 0;
}
