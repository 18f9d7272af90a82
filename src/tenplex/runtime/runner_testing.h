// The runner's test seams, shared by runner_test.cc and runner_continue_test.cc: a
// /bin/sh worker speaking train.py's hand-off protocol, a fake state backend that checks
// the version protocol, a launcher that records every command line, and the fixture
// that runs a schedule through them.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "tenplex/model/gpt.h"
#include "tenplex/ptc/config.h"
#include "tenplex/runtime/backend.h"
#include "tenplex/runtime/process.h"
#include "tenplex/runtime/schedule_loop.h"
#include "tenplex/util/file.h"

namespace tenplex::runtime::runner_testing {

namespace fs = std::filesystem;
using nlohmann::json;

// A worker in /bin/sh: train.py's side of the protocol without torch. Rank 0 logs
// {"step", "loss", "config", "samples"} per step (loss 100 - step, samples the
// consumed count before the step), writes <file>.result after waiting for each
// hand-off file and logs {"event": "commit"}; the other ranks wait for the result
// (train.py's barrier). --fail-rank R --fail-step S: rank R
// writes a message and exits 3 at step S; --hang-step S: every rank sleeps there.
inline constexpr char kWorker[] = R"SH(
rank=0; start=0; steps=0; log=; out=; every=0; prefix=; cfg=; in=; fail_rank=-1; fail_step=-1; hang_step=-1
step_s=0.15
while [ $# -gt 0 ]; do
  case "$1" in
    --world-rank) rank=$2; shift;;
    --start-step) start=$2; shift;;
    --steps) steps=$2; shift;;
    --log) log=$2; shift;;
    --state-out) out=$2; shift;;
    --commit-every) every=$2; shift;;
    --commit-prefix) prefix=$2; shift;;
    --config) cfg=$2; shift;;
    --state-in) in=$2; shift;;
    --fail-rank) fail_rank=$2; shift;;
    --fail-step) fail_step=$2; shift;;
    --hang-step) hang_step=$2; shift;;
    --step-seconds) step_s=$2; shift;;
  esac
  shift
done
samples=0
if [ -n "$in" ]; then
  samples=$(sed -n 's/.*"samples_consumed":\([0-9]*\).*/\1/p' "$in")
  instep=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$in")
  if [ "$instep" != "$start" ]; then echo "--start-step $start but $in is at step $instep" >&2; exit 4; fi
fi
result() {
  while [ ! -f "$1" ]; do sleep 0.005; done
  if [ "$rank" = 0 ]; then
    printf '{"step": %d, "samples_consumed": %d}' "$2" "$3" > "$1.result.tmp" && mv "$1.result.tmp" "$1.result"
    printf '{"event": "commit", "step": %d}\n' "$2" >> "$log"
  else
    while [ ! -f "$1.result" ]; do sleep 0.005; done  # train.py's barrier
  fi
}
step=$start; end=$((start + steps))
while [ $step -lt $end ]; do
  if [ $step = $hang_step ]; then sleep 1000; fi
  sleep $step_s
  if [ "$rank" = "$fail_rank" ] && [ $step = $fail_step ]; then echo "worker $rank: out of memory at step $step" >&2; exit 3; fi
  if [ "$rank" = 0 ]; then
    printf '{"step": %d, "loss": %d.5, "config": "%s", "samples": [%d]}\n' $step $((100 - step)) "$cfg" $samples >> "$log"
  fi
  step=$((step + 1)); samples=$((samples + 8))
  if [ $every -gt 0 ] && [ $step -lt $end ] && [ $(((step - start) % every)) = 0 ]; then result "$prefix$step.json" $step $samples; fi
done
result "$out" $step $samples
)SH";

// Versions in memory, checking the protocol the runner must follow: one open
// version at a time, commits of the open version only, in increasing order.
class FakeBackend : public StateBackend {
 public:
  explicit FakeBackend(std::string dir) : dir_(std::move(dir)) {}
  std::string work_dir() const override { return dir_ + "/work"; }
  bool work_dir_kept() const override { return work_dir_kept_; }
  Result<std::optional<Committed>> Current(const std::string&) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!current_) return std::optional<Committed>();
    return std::optional<Committed>(Committed{*current_, infos_.at(*current_)});
  }
  Result<uint64_t> BeginLayout(const std::string&, const Layout&, io::StateInfo info) override {
    std::lock_guard<std::mutex> l(mu_);
    if (open_) return FailedPrecondition("version " + std::to_string(*open_) + " is still open");
    open_ = ++last_;
    infos_[*open_] = info;
    return *open_;
  }
  Result<std::vector<std::map<std::string, std::string>>> Files(const std::string&, uint64_t v,
                                                                const Layout& layout) override {
    std::vector<std::map<std::string, std::string>> out(layout.world_size());
    for (const RankLayout& r : layout.ranks) {
      for (const LocalTensor& t : *r.tensors)
        out[r.rank][t.name] = dir_ + "/v" + std::to_string(v) + "/" + t.name;
    }
    return out;
  }
  Status Commit(const std::string&, uint64_t v, const io::StateInfo& info) override {
    std::lock_guard<std::mutex> l(mu_);
    if (open_ != v)
      return FailedPrecondition("commit of version " + std::to_string(v) + ", which is not open");
    if (current_ && v <= *current_) return FailedPrecondition("commit out of order");
    infos_[v] = info;
    current_ = v;
    open_.reset();
    commits.push_back({v, info.step().value_or(-1), info.samples_consumed().value_or(-1),
                       info.config().ToString()});
    ++n_commits;
    return Status::Ok();
  }
  void Drop(const std::string&, uint64_t v) override {
    std::lock_guard<std::mutex> l(mu_);
    if (open_ == v) open_.reset();
    drops.push_back(v);
  }
  Result<Moved> Transform(const std::string&, const ParallelConfig& to) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!current_ || open_)
      return FailedPrecondition("transform without a committed version or with an open one");
    io::StateInfo info = infos_.at(*current_);
    info.set_config(to);
    current_ = ++last_;
    infos_[*current_] = info;
    transforms.push_back(to.ToString());
    Moved m{*current_, 100, 200, 50};
    if (!presizes.empty() && presizes.back().config == to.ToString()) {
      m.presized = true;
      m.presize_poolable_bytes = 64;
      m.presize_pooled_bytes = 48;
      m.presize_seconds = 0.5;
    }
    return m;
  }
  // Records the call with the committed version it would plan from.
  void PresizeAhead(const std::string&, const ParallelConfig& to) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!current_) {
      presizes.push_back({to.ToString(), -1, ""});
      return;
    }
    const io::StateInfo& info = infos_.at(*current_);
    presizes.push_back({to.ToString(), info.step().value_or(-1), info.config().ToString()});
  }
  // Test setup: a committed version as a previous run left it (a valid StateInfo).
  void Preload(const json& info) {
    Result<io::StateInfo> parsed = io::StateInfo::Parse(info.dump());
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    current_ = ++last_;
    infos_[*current_] = *parsed;
  }
  std::optional<uint64_t> open() const {
    std::lock_guard<std::mutex> l(mu_);
    return open_;
  }
  std::optional<uint64_t> current() const {
    std::lock_guard<std::mutex> l(mu_);
    return current_;
  }

  struct CommitRecord {
    uint64_t version;
    int64_t step, samples;
    std::string config;
  };
  std::vector<CommitRecord> commits;
  std::vector<uint64_t> drops;
  std::vector<std::string> transforms;
  struct PresizeRecord {
    std::string config;       // the target
    int64_t from_step;        // the committed version's step and config at the call
    std::string from_config;  // (-1, "": none)
  };
  std::vector<PresizeRecord> presizes;
  std::atomic<int> n_commits{0};
  bool work_dir_kept_ = true;

 private:
  std::string dir_;
  mutable std::mutex mu_;
  uint64_t last_ = 0;
  std::optional<uint64_t> open_, current_;
  std::map<uint64_t, io::StateInfo> infos_;
};

// The real launcher, recording every command line and reap; fail_spawn = n refuses
// the n-th start (0-based).
class RecordingLauncher : public ProcessLauncher {
 public:
  Result<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log) override {
    std::lock_guard<std::mutex> l(mu_);
    if (static_cast<int>(argvs.size()) == fail_spawn)
      return Unavailable("the test refuses to start this worker");
    argvs.push_back(argv);
    TP_ASSIGN_OR_RETURN(pid_t pid, real_->Spawn(argv, log));
    pids.push_back(pid);
    return pid;
  }
  void Kill(pid_t pid) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      killed.push_back(pid);
    }
    real_->Kill(pid);
  }
  std::optional<int> TryWait(pid_t pid) override {
    std::optional<int> s = real_->TryWait(pid);
    std::lock_guard<std::mutex> l(mu_);
    if (s) reaped.insert(pid);
    return s;
  }
  int Wait(pid_t pid) override {
    int s = real_->Wait(pid);
    std::lock_guard<std::mutex> l(mu_);
    reaped.insert(pid);
    return s;
  }
  bool AllReaped() const {
    std::lock_guard<std::mutex> l(mu_);
    for (pid_t p : pids) {
      if (!reaped.count(p)) return false;
    }
    return true;
  }
  // The value after `flag` in start `n`'s command line ("" when absent).
  std::string Arg(std::size_t n, const std::string& flag) const {
    std::lock_guard<std::mutex> l(mu_);
    const auto& a = argvs.at(n);
    for (std::size_t i = 0; i + 1 < a.size(); ++i) {
      if (a[i] == flag) return a[i + 1];
    }
    return "";
  }
  std::size_t starts() const {
    std::lock_guard<std::mutex> l(mu_);
    return argvs.size();
  }

  int fail_spawn = -1;
  std::vector<std::vector<std::string>> argvs;
  std::vector<pid_t> pids;
  std::vector<pid_t> killed;  // every Kill, in order
  std::set<pid_t> reaped;

 private:
  mutable std::mutex mu_;
  std::unique_ptr<ProcessLauncher> real_ = NewProcessLauncher();
};

// The runner's events named `name` in the log at `path` (a line being written is skipped).
inline std::vector<json> LogEvents(const std::string& path, const std::string& name) {
  std::vector<json> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == name) out.push_back(j);
  }
  return out;
}

// A fresh directory /tmp/tenplex-<name>-test-XXXXXX (into dir) with the /bin/sh
// worker script and a 2-layer GPT model, and the run options that use them.
inline void PrepareRunDir(const std::string& name, const char* worker, std::string& dir,
                          RunOptions& o) {
  std::string tmpl = "/tmp/tenplex-" + name + "-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  dir = tmpl;
  ASSERT_TRUE(WriteFileAtomic(dir + "/worker.sh", worker).ok());
  GptArgs a;
  a.num_layers = 2;
  ASSERT_TRUE(WriteFileAtomic(dir + "/model.json", ModelToJson(*MakeGpt(a))).ok());
  o.model_path = dir + "/model.json";
  o.log_path = dir + "/log.jsonl";
  o.schedule_path = dir + "/schedule.json";
  o.command = {"/bin/sh", dir + "/worker.sh"};
  o.hang_seconds = 30;
}

class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PrepareRunDir("runner", kWorker, dir_, o_);
    backend_ = std::make_unique<FakeBackend>(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Result<RunSummary> RunIt(const json& schedule) {
    TP_RETURN_IF_ERROR(WriteFileAtomic(o_.schedule_path, schedule.dump()));
    TP_ASSIGN_OR_RETURN(RunInputs in, LoadRunInputs(o_));
    return RunSchedule(o_, in, *backend_, launcher_);
  }
  // A committed version as an earlier run leaves it: this model, 8 samples a step.
  void PreloadAt(int64_t step, const std::string& config) {
    backend_->Preload({{"model", json::parse(*ReadFile(o_.model_path))},
                       {"config", config},
                       {"step", step},
                       {"samples_consumed", 8 * step}});
  }
  // The runner's events of the log, by name.
  std::vector<json> Events(const std::string& name) { return LogEvents(o_.log_path, name); }
  // How often each step was logged.
  std::map<int64_t, int> StepCounts() {
    std::map<int64_t, int> out;
    std::ifstream f(o_.log_path);
    for (std::string line; std::getline(f, line);) {
      json j = json::parse(line, nullptr, false);  // a line being written is skipped
      if (j.is_object() && !j.contains("event") && j["step"].is_number_integer())
        ++out[j["step"].get<int64_t>()];
    }
    return out;
  }

  std::string dir_;
  RunOptions o_;
  std::unique_ptr<FakeBackend> backend_;
  RecordingLauncher launcher_;
};

inline std::vector<int64_t> Steps(const RunSummary& s) {
  std::vector<int64_t> out;
  for (const StepRecord& r : s.steps) out.push_back(r.step);
  return out;
}

}  // namespace tenplex::runtime::runner_testing
