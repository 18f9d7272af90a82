// Strided box copy against a plain memcpy of the same bytes, measured in the same run.
// Source: a [rows, 2*run] tensor, box = left half of every row (strided); destination:
// a dense [rows, run] tensor. Counters: GB/s of the box copy, memcpy GB/s, and their
// ratio (goal >= 0.8 for runs >= 4 KiB).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "tenplex/geometry/copy.h"

namespace {

using tenplex::Box;
using tenplex::Shape;

// Each iteration times a memcpy of the same bytes, then the box copy; "ratio" is
// memcpy time / box copy time.
void BM_CopyBoxRatio(benchmark::State& state) {
  const int64_t run_bytes = state.range(0);
  const bool threads = state.range(1) != 0;
  const int64_t total = 256ll << 20;
  const int64_t run = run_bytes / 4, rows = total / run_bytes;
  Shape ss = {rows, 2 * run}, ds = {rows, run};
  std::vector<float> src(rows * 2 * run, 1.f), dst(rows * run, 0.f), flat(rows * run, 0.f);
  Box sb({{0, rows}, {0, run}});
  tenplex::ThreadPool* pool = threads ? &tenplex::ThreadPool::Default() : nullptr;
  double copy_s = 0, memcpy_s = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(flat.data(), src.data(), total);
    benchmark::ClobberMemory();
    auto t1 = std::chrono::steady_clock::now();
    auto st = tenplex::CopyBox({src.data(), ss, sb}, {dst.data(), ds, tenplex::BoxOf(ds)}, 4, pool);
    benchmark::ClobberMemory();
    auto t2 = std::chrono::steady_clock::now();
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    memcpy_s += std::chrono::duration<double>(t1 - t0).count();
    copy_s += std::chrono::duration<double>(t2 - t1).count();
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["copy_GBps"] = total * n / copy_s / 1e9;
  state.counters["memcpy_GBps"] = total * n / memcpy_s / 1e9;
  state.counters["ratio"] = memcpy_s / copy_s;
}

}  // namespace

// Args: inner run bytes, threads (0/1).
BENCHMARK(BM_CopyBoxRatio)
    ->ArgsProduct({{256, 4096, 65536, 1 << 20}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);

BENCHMARK_MAIN();
