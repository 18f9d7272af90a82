// Planner speed and size. The case: gpt3-175b with fp32 Adam from
// tp=8,pp=16,dp=8 to tp=8,pp=12,dp=10, 8 GPUs per host; goal under 1 s on one core
// and under 1 GiB. Counters: ops, the plan's own bytes (ops and their boxes), the
// process's peak RSS, and limit_ratio = plan seconds / goal_s (below 1 meets the goal):
// 1 s, and 0.5 s at 384 layers (issue 15 §5: 384 layers x 1984 ranks under 0.5 s).
// Then growth with the number of layers (world size fixed) and with the world size
// (dp scaled, model fixed), all on one thread; then the whole plan on every hardware
// thread against one. Layout construction is timed on its own.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <thread>

#include "tenplex/model/gpt.h"
#include "tenplex/plan/planner.h"

namespace {

using tenplex::Layout;
using tenplex::Model;

Model Gpt175b(int layers) {
  auto args = *tenplex::GptPreset("gpt3-175b");
  args.num_layers = layers;
  return *tenplex::MakeGpt(args);
}

// CPU seconds of this thread (a loaded machine inflates them less than wall time).
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double PeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

int64_t PlanBytes(const tenplex::plan::Plan& p) {
  int64_t b =
      static_cast<int64_t>((p.ops.capacity() + p.kept.capacity()) * sizeof(tenplex::plan::CopyOp));
  auto boxes = [](const tenplex::plan::CopyOp& op) {
    // Three boxes, each one heap block of rank intervals (plus allocator overhead).
    return static_cast<int64_t>(3 * (op.global.rank() * sizeof(tenplex::Interval) + 16));
  };
  for (const auto& op : p.ops) b += boxes(op);
  for (const auto& op : p.kept) b += boxes(op);
  return b;
}

// Times `make` (a MakePlan or MakeHostPlan call) in the benchmark loop and reports ops,
// plan size, peak RSS, MakePlan seconds alone and CPU seconds, the ratio to goal_s and
// whether the plan's cross-host bytes are at the lower bound.
template <class MakeFn>
void TimePlans(benchmark::State& state, int world, double goal_s, MakeFn make) {
  double seconds = 0, cpu = 0;
  int64_t ops = 0, bytes = 0;
  bool at_bound = true;
  for (auto _ : state) {
    const double c0 = ThreadCpuSeconds();
    auto t0 = std::chrono::steady_clock::now();
    auto p = make();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cpu += ThreadCpuSeconds() - c0;
    if (!p.ok()) {
      state.SkipWithError(p.status().message().c_str());
      return;
    }
    ops = static_cast<int64_t>(p->ops.size());
    bytes = PlanBytes(*p);
    at_bound = at_bound && p->stats.bytes_cross_host == p->stats.cross_host_lower_bound;
  }
  const double per = seconds / static_cast<double>(state.iterations());
  state.counters["ops"] = static_cast<double>(ops);
  state.counters["plan_MiB"] = static_cast<double>(bytes) / (1 << 20);
  state.counters["peak_rss_MiB"] = PeakRssMiB();
  state.counters["world"] = world;
  state.counters["goal_s"] = goal_s;
  state.counters["plan_s"] = per;  // MakePlan alone (the real time also frees the plan)
  state.counters["plan_cpu_s"] = cpu / static_cast<double>(state.iterations());
  state.counters["limit_ratio"] = per / goal_s;
  state.counters["at_lower_bound"] = at_bound ? 1 : 0;
}

// On one thread: the goals are per core (MakePlan's default would use every core).
void RunPlan(benchmark::State& state, const Model& m, const std::string& from_cfg,
             const std::string& to_cfg, double goal_s = 1.0) {
  const Layout from = *tenplex::MakeLayout(m, *tenplex::ParseConfig(from_cfg));
  const Layout to = *tenplex::MakeLayout(m, *tenplex::ParseConfig(to_cfg));
  const auto fh = tenplex::plan::DefaultHosts(from.world_size(), 8);
  const auto th = tenplex::plan::DefaultHosts(to.world_size(), 8);
  TimePlans(state, from.world_size() + to.world_size(), goal_s,
            [&] { return tenplex::plan::MakePlan(m, from, to, fh, th, 1); });
}

void BM_Plan175b(benchmark::State& state) {
  static const Model m = Gpt175b(96);
  RunPlan(state, m, "tp=8,pp=16,dp=8", "tp=8,pp=12,dp=10");
}
BENCHMARK(BM_Plan175b)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Layouts175b(benchmark::State& state) {
  static const Model m = Gpt175b(96);
  for (auto _ : state) {
    auto a = tenplex::MakeLayout(m, *tenplex::ParseConfig("tp=8,pp=16,dp=8"));
    auto b = tenplex::MakeLayout(m, *tenplex::ParseConfig("tp=8,pp=12,dp=10"));
    benchmark::DoNotOptimize(a);
    benchmark::DoNotOptimize(b);
  }
}
BENCHMARK(BM_Layouts175b)->Unit(benchmark::kMillisecond);

// Growth with layers: 48 .. 384 layers, same parallel configs; the goal at 384 layers
// (0.93 M ops) is 0.5 s.
void BM_PlanLayers(benchmark::State& state) {
  const int layers = static_cast<int>(state.range(0));
  const Model m = Gpt175b(layers);
  RunPlan(state, m, "tp=8,pp=16,dp=8", "tp=8,pp=12,dp=10", layers >= 384 ? 0.5 : 1.0);
}
BENCHMARK(BM_PlanLayers)->Arg(48)->Arg(96)->Arg(192)->Arg(384)->Unit(benchmark::kMillisecond);

// Growth with world size: dp 4 .. 32 (512 .. 4096 old ranks), dp grows by 5/4.
void BM_PlanWorld(benchmark::State& state) {
  static const Model m = Gpt175b(96);
  const int dp = static_cast<int>(state.range(0));
  RunPlan(state, m, "tp=8,pp=16,dp=" + std::to_string(dp),
          "tp=8,pp=12,dp=" + std::to_string(dp * 5 / 4));
}
BENCHMARK(BM_PlanWorld)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Unit(benchmark::kMillisecond);

// The whole plan on every hardware thread against one (planner.h, "Parallel"), in the same
// iteration: gpt3-175b at 8,192 GPUs scaled down by 10 % of dp (tp=8,pp=16,dp=64 ->
// dp=57), 8 GPUs per host. speedup = one thread's seconds / all threads'; efficiency =
// speedup / threads (1: the limit, every thread busy for the whole plan).
void BM_PlanThreads(benchmark::State& state) {
  static const Model m = Gpt175b(96);
  const Layout from = *tenplex::MakeLayout(m, *tenplex::ParseConfig("tp=8,pp=16,dp=64"));
  const Layout to = *tenplex::MakeLayout(m, *tenplex::ParseConfig("tp=8,pp=16,dp=57"));
  const auto fh = tenplex::plan::DefaultHosts(from.world_size(), 8);
  const auto th = tenplex::plan::DefaultHosts(to.world_size(), 8);
  const int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  double one = 0, all = 0;
  for (auto _ : state) {
    for (int t : {1, threads}) {
      const auto t0 = std::chrono::steady_clock::now();
      auto p = tenplex::plan::MakePlan(m, from, to, fh, th, t);
      (t == 1 ? one : all) +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!p.ok()) {
        state.SkipWithError(p.status().message().c_str());
        return;
      }
    }
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["threads"] = threads;
  state.counters["one_thread_s"] = one / n;
  state.counters["all_threads_s"] = all / n;
  state.counters["speedup"] = one / all;
  state.counters["efficiency"] = one / all / threads;
}
BENCHMARK(BM_PlanThreads)->Unit(benchmark::kMillisecond)->Iterations(3);

// Per-host planning at 16,384 GPUs: gpt3-175b from tp=8,pp=16,dp=128 (16,384 ranks,
// 2,048 hosts) to tp=8,pp=12,dp=160 (15,360 ranks); one host's plan (MakeHostPlan),
// host 0 and a middle host. Goal: under 1 s and 256 MiB peak RSS (the layouts
// included), so limit_ratio = plan seconds / 1 s. Run it in a process of its own
// (--benchmark_filter=BM_PlanHost) for an honest peak RSS.
void BM_PlanHost16k(benchmark::State& state) {
  static const Model m = Gpt175b(96);
  const Layout from = *tenplex::MakeLayout(m, *tenplex::ParseConfig("tp=8,pp=16,dp=128"));
  const Layout to = *tenplex::MakeLayout(m, *tenplex::ParseConfig("tp=8,pp=12,dp=160"));
  const auto fh = tenplex::plan::DefaultHosts(from.world_size(), 8);
  const auto th = tenplex::plan::DefaultHosts(to.world_size(), 8);
  const int host = static_cast<int>(state.range(0));
  TimePlans(state, from.world_size() + to.world_size(), 1.0,
            [&] { return tenplex::plan::MakeHostPlan(m, from, to, fh, th, host); });
}
BENCHMARK(BM_PlanHost16k)->Arg(0)->Arg(960)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
