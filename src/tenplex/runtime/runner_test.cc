// The runner's state machine (schedule loop, segments, commits, kills, failures)
// through its seams: a fake state backend that checks the version protocol, and
// /bin/sh workers that speak train.py's hand-off protocol (step lines, periodic
// commits, results), started through a launcher that records every command line.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
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

namespace tenplex::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A worker in /bin/sh: train.py's side of the protocol without torch. Rank 0 logs
// {"step", "loss", "config", "samples"} per step (loss 100 - step, samples the
// consumed count before the step), writes <file>.result after waiting for each
// hand-off file and logs {"event": "commit"}; the other ranks wait for the result
// (train.py's barrier). --fail-rank R --fail-step S: rank R
// writes a message and exits 3 at step S; --hang-step S: every rank sleeps there.
constexpr char kWorker[] = R"SH(
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
  Result<uint64_t> BeginLayout(const std::string&, const Layout&, json info) override {
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
  Status Commit(const std::string&, uint64_t v, const json& info) override {
    std::lock_guard<std::mutex> l(mu_);
    if (open_ != v)
      return FailedPrecondition("commit of version " + std::to_string(v) + ", which is not open");
    if (current_ && v <= *current_) return FailedPrecondition("commit out of order");
    infos_[v] = info;
    current_ = v;
    open_.reset();
    commits.push_back(
        {v, info["step"].get<int64_t>(), info["samples_consumed"].get<int64_t>(), info["config"]});
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
    json info = infos_.at(*current_);
    info["config"] = to.ToString();
    current_ = ++last_;
    infos_[*current_] = info;
    transforms.push_back(to.ToString());
    return Moved{*current_, 100, 200, 50};
  }
  // Test setup: a committed version as a previous run left it.
  void Preload(const json& info) {
    current_ = ++last_;
    infos_[*current_] = info;
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
  std::atomic<int> n_commits{0};
  bool work_dir_kept_ = true;

 private:
  std::string dir_;
  mutable std::mutex mu_;
  uint64_t last_ = 0;
  std::optional<uint64_t> open_, current_;
  std::map<uint64_t, json> infos_;
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
  void Kill(pid_t pid) override { real_->Kill(pid); }
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
  std::set<pid_t> reaped;

 private:
  mutable std::mutex mu_;
  std::unique_ptr<ProcessLauncher> real_ = NewProcessLauncher();
};

class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tenplex-runner-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/worker.sh", kWorker).ok());
    GptArgs a;
    a.num_layers = 2;
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/model.json", ModelToJson(*MakeGpt(a))).ok());
    o_.model_path = dir_ + "/model.json";
    o_.log_path = dir_ + "/log.jsonl";
    o_.schedule_path = dir_ + "/schedule.json";
    o_.command = {"/bin/sh", dir_ + "/worker.sh"};
    o_.hang_seconds = 30;
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
  std::vector<json> Events(const std::string& name) {
    std::vector<json> out;
    std::ifstream f(o_.log_path);
    for (std::string line; std::getline(f, line);) {
      json j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == name) out.push_back(j);
    }
    return out;
  }
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

std::vector<int64_t> Steps(const RunSummary& s) {
  std::vector<int64_t> out;
  for (const StepRecord& r : s.steps) out.push_back(r.step);
  return out;
}

TEST_F(RunnerTest, CommitsInStepOrderAndHandsStateOver) {
  o_.commit_every = 2;
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 4, "config": "tp=2"},
                                 {"step": 7, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(Steps(*s), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  // Segment [0,4): commits after steps 2 and 4; transform; segment [4,7): after 6, 7.
  ASSERT_EQ(backend_->commits.size(), 4u);
  std::vector<int64_t> steps;
  for (std::size_t k = 0; k < backend_->commits.size(); ++k) {
    const auto& c = backend_->commits[k];
    steps.push_back(c.step);
    EXPECT_EQ(c.samples, 8 * c.step) << "commit " << k;
    if (k > 0) {
      EXPECT_GT(c.version, backend_->commits[k - 1].version);
    }
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 6, 7}));
  EXPECT_EQ(backend_->commits[1].config, "tp=1,pp=1,dp=2");
  EXPECT_EQ(backend_->commits[3].config, "tp=2,pp=1,dp=1");
  EXPECT_EQ(backend_->transforms, std::vector<std::string>{"tp=2,pp=1,dp=1"});
  EXPECT_TRUE(backend_->drops.empty());
  EXPECT_FALSE(backend_->open());
  // Two workers per segment; the second segment starts at step 4 from the state.
  ASSERT_EQ(launcher_.starts(), 4u);
  EXPECT_EQ(launcher_.Arg(0, "--start-step"), "0");
  EXPECT_EQ(launcher_.Arg(0, "--steps"), "4");
  EXPECT_EQ(launcher_.Arg(0, "--state-in"), "");
  EXPECT_EQ(launcher_.Arg(1, "--world-rank"), "1");
  EXPECT_EQ(launcher_.Arg(2, "--start-step"), "4");
  EXPECT_EQ(launcher_.Arg(2, "--steps"), "3");
  EXPECT_EQ(launcher_.Arg(2, "--commit-every"), "2");
  EXPECT_NE(launcher_.Arg(2, "--state-in"), "");
  EXPECT_TRUE(launcher_.AllReaped());
  ASSERT_EQ(s->reconfigurations.size(), 1u);
  const ReconfigureRecord& r = s->reconfigurations[0];
  EXPECT_EQ(r.step, 4);
  EXPECT_FALSE(r.after_failure);
  EXPECT_EQ(r.bytes_moved, 100);
  EXPECT_GT(r.restart_seconds, 0);
  EXPECT_EQ(Events("reconfigure").size(), 1u);
  EXPECT_EQ(Events("commit").size(), 4u);
}

TEST_F(RunnerTest, KillMidSegmentReRunsOnlyTheStepsSinceTheLastCommit) {
  o_.commit_every = 1;
  o_.command.insert(o_.command.end(), {"--step-seconds", "0.3"});  // the kill comes half a step in
  auto s = RunIt(json::parse(
      R"([{"step": 0, "config": "dp=2"}, {"step": 5, "config": "dp=2", "kill_ranks": [1]},
                                 {"step": 7, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(Steps(*s), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  std::vector<json> fails = Events("failure");
  ASSERT_EQ(fails.size(), 1u) << *ReadFile(o_.log_path);
  const int64_t rerun = fails[0]["rerun_from"].get<int64_t>();
  EXPECT_EQ(fails[0]["during_step"], 4);
  EXPECT_EQ(fails[0]["killed_ranks"], json::array({1}));
  // Killed in the middle of step 4: steps 0-3 are committed (one step per commit),
  // so at most step 3's commit can be missing when the kill strikes.
  EXPECT_TRUE(rerun == 4 || rerun == 3) << fails[0];
  // The restart loads the last commit: its step, version and samples.
  ASSERT_EQ(launcher_.starts(), 4u);
  EXPECT_EQ(launcher_.Arg(2, "--start-step"), std::to_string(rerun));
  EXPECT_NE(launcher_.Arg(2, "--state-in"), "");
  // Steps before the commit ran once, the lost ones twice.
  std::map<int64_t, int> counts = StepCounts();
  for (int64_t k = 0; k < 7; ++k) EXPECT_EQ(counts[k], k >= rerun && k < 4 ? 2 : 1) << "step " << k;
  EXPECT_EQ(backend_->drops.size(), 1u);  // the version being written at the kill
  EXPECT_FALSE(backend_->open());
  int64_t last = -1;
  for (const auto& c : backend_->commits) {
    EXPECT_GT(c.step, last);
    EXPECT_EQ(c.samples, 8 * c.step);
    last = c.step;
  }
  EXPECT_EQ(last, 7);
  ASSERT_EQ(s->reconfigurations.size(), 1u);
  const ReconfigureRecord& r = s->reconfigurations[0];
  EXPECT_TRUE(r.after_failure);
  EXPECT_EQ(r.killed, std::vector<int>{1});
  EXPECT_EQ(r.failed_step, 4);
  EXPECT_EQ(r.lost_steps, 4 - rerun);
  EXPECT_GT(r.recovered_seconds, 0);
  std::vector<json> rec = Events("recovered");
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec[0]["step"], 4);
  EXPECT_TRUE(backend_->transforms.empty());  // same config, state in place
  EXPECT_TRUE(launcher_.AllReaped());
}

TEST_F(RunnerTest, WithoutPeriodicCommitsAKillReRunsTheSegment) {
  auto s = RunIt(json::parse(
      R"([{"step": 0, "config": "tp=2"}, {"step": 3, "config": "pp=2", "kill_ranks": [0]},
                                 {"step": 4, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<json> fails = Events("failure");
  ASSERT_EQ(fails.size(), 1u);
  EXPECT_EQ(fails[0]["rerun_from"], 0);
  EXPECT_EQ(fails[0]["segment_start"], 0);
  // No state was ever committed: the restart in pp=2 starts from scratch at step 0.
  EXPECT_TRUE(backend_->transforms.empty());
  ASSERT_EQ(launcher_.starts(), 4u);
  EXPECT_EQ(launcher_.Arg(2, "--config"), "tp=1,pp=2,dp=1");
  EXPECT_EQ(launcher_.Arg(2, "--start-step"), "0");
  EXPECT_EQ(launcher_.Arg(2, "--state-in"), "");
  std::map<int64_t, int> counts = StepCounts();
  EXPECT_EQ(counts[0], 2);
  EXPECT_EQ(counts[1], 2);
  EXPECT_EQ(counts[3], 1);
  ASSERT_EQ(backend_->commits.size(), 1u);
  EXPECT_EQ(backend_->commits[0].step, 4);
  EXPECT_EQ(backend_->commits[0].config, "tp=1,pp=2,dp=1");
}

TEST_F(RunnerTest, WorkerFailureReportsTheEndOfItsLog) {
  o_.commit_every = 1;
  o_.command.insert(o_.command.end(), {"--fail-rank", "1", "--fail-step", "2"});
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 4, "stop": true}])"));
  ASSERT_FALSE(s.ok());
  const std::string msg = s.status().message();
  EXPECT_NE(msg.find("worker rank 1 exited with code 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("worker 1: out of memory at step 2"), std::string::npos) << msg;
  EXPECT_FALSE(backend_->open());  // dropped
  EXPECT_LE(backend_->commits.size(), 3u);
  EXPECT_TRUE(launcher_.AllReaped());
}

TEST_F(RunnerTest, InterruptStopsWorkersAndNamesTheCommittedVersion) {
  o_.commit_every = 1;
  auto run = std::async(std::launch::async, [&] {
    return RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 50, "stop": true}])"));
  });
  for (int k = 0; k < 2000 && backend_->n_commits < 2; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(backend_->n_commits.load(), 2);
  ::kill(::getpid(), SIGINT);
  Result<RunSummary> s = run.get();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kAborted);
  const std::string want = "last committed version (" + std::to_string(*backend_->current()) + ")";
  EXPECT_NE(s.status().message().find(want), std::string::npos) << s.status().message();
  EXPECT_FALSE(backend_->open());
  EXPECT_TRUE(launcher_.AllReaped());
}

TEST_F(RunnerTest, AWorkerThatCannotStartStopsTheOthers) {
  launcher_.fail_spawn = 1;
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 2, "stop": true}])"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("refuses"), std::string::npos) << s.status().message();
  EXPECT_EQ(launcher_.pids.size(), 1u);
  EXPECT_TRUE(launcher_.AllReaped());
  EXPECT_FALSE(backend_->open());
  EXPECT_TRUE(backend_->commits.empty());
}

TEST_F(RunnerTest, NoProgressFailsTheRun) {
  o_.hang_seconds = 1;
  o_.command.insert(o_.command.end(), {"--hang-step", "1"});
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 3, "stop": true}])"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no progress for 1 s"), std::string::npos)
      << s.status().message();
  EXPECT_TRUE(launcher_.AllReaped());
  EXPECT_FALSE(backend_->open());
}

// ---- continuing a job, kept logs, the log file (issue 16 bugs 2, 3, 4)

TEST_F(RunnerTest, ContinuesFromTheCommittedVersion) {
  std::vector<std::string> notes;
  o_.notify = [&](const std::string& m) { notes.push_back(m); };
  PreloadAt(3, "tp=1,pp=1,dp=2");
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "tp=2"}, {"step": 2, "config": "dp=2"},
                                 {"step": 5, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // Entry 1 (dp=2) from step 3: no transform, the workers load version 1.
  ASSERT_EQ(launcher_.starts(), 2u);
  EXPECT_EQ(launcher_.Arg(0, "--config"), "tp=1,pp=1,dp=2");
  EXPECT_EQ(launcher_.Arg(0, "--start-step"), "3");
  EXPECT_EQ(launcher_.Arg(0, "--steps"), "2");
  json in = json::parse(*ReadFile(launcher_.Arg(0, "--state-in")));
  EXPECT_EQ(in["step"], 3);
  EXPECT_EQ(in["samples_consumed"], 24);
  EXPECT_TRUE(backend_->transforms.empty());
  EXPECT_EQ(Steps(*s), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(s->steps[0].samples, std::vector<int64_t>{24});  // the data order goes on
  ASSERT_EQ(backend_->commits.size(), 1u);
  EXPECT_EQ(backend_->commits[0].step, 5);
  EXPECT_EQ(backend_->commits[0].samples, 40);
  EXPECT_EQ(s->resumed_version, std::optional<uint64_t>(1));
  EXPECT_EQ(s->resumed_step, 3);
  ASSERT_EQ(Events("resume").size(), 1u);
  EXPECT_EQ(Events("resume")[0]["version"], 1);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("continuing job 'train' from its committed version 1: step 3"),
            std::string::npos)
      << notes[0];
  EXPECT_NE(SummaryTable(*s).find("continued from version 1 at step 3"), std::string::npos);
}

TEST_F(RunnerTest, ContinuingInAnotherConfigTransformsFirst) {
  PreloadAt(3, "tp=2,pp=1,dp=1");
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "tp=2"}, {"step": 2, "config": "dp=2"},
                                 {"step": 4, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(backend_->transforms, std::vector<std::string>{"tp=1,pp=1,dp=2"});
  EXPECT_EQ(launcher_.Arg(0, "--config"), "tp=1,pp=1,dp=2");
  EXPECT_EQ(launcher_.Arg(0, "--start-step"), "3");
  ASSERT_EQ(s->reconfigurations.size(), 1u);
  EXPECT_EQ(s->reconfigurations[0].from, "tp=2,pp=1,dp=1");
  EXPECT_EQ(s->reconfigurations[0].step, 3);
}

TEST_F(RunnerTest, InterruptNamesTheVersionItContinuedFrom) {
  PreloadAt(12, "tp=1,pp=1,dp=2");
  auto run = std::async(std::launch::async, [&] {
    return RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 60, "stop": true}])"));
  });
  // Interrupted after the first step line, before any commit of this run.
  for (int k = 0; k < 2000 && StepCounts().empty(); ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_FALSE(StepCounts().empty());
  ::kill(::getpid(), SIGINT);
  Result<RunSummary> s = run.get();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("last committed version (1)"), std::string::npos)
      << s.status().message();
  EXPECT_TRUE(backend_->commits.empty());
}

TEST_F(RunnerTest, RefusesToContinueStateItCannotUse) {
  backend_->Preload({{"model", json::parse(*ReadFile(o_.model_path))},
                     {"config", "tp=1,pp=1,dp=2"},
                     {"samples_consumed", 24}});
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 4, "stop": true}])"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("has no step"), std::string::npos) << s.status().message();
  TearDown();
  SetUp();
  backend_->Preload({{"model", {{"tensors", json::array()}}},
                     {"config", "tp=1,pp=1,dp=2"},
                     {"step", 1},
                     {"samples_consumed", 8}});
  s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 4, "stop": true}])"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("another model"), std::string::npos) << s.status().message();
  EXPECT_EQ(launcher_.starts(), 0u);
}

TEST_F(RunnerTest, AFinishedJobHasNothingToRun) {
  std::vector<std::string> notes;
  o_.notify = [&](const std::string& m) { notes.push_back(m); };
  PreloadAt(4, "tp=1,pp=1,dp=2");
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 4, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(launcher_.starts(), 0u);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("nothing to run"), std::string::npos) << notes[0];
}

// The path a failure message names as the worker's output.
std::string OutputPath(const std::string& msg) {
  const std::string key = "its output (";
  std::size_t a = msg.find(key);
  if (a == std::string::npos) return "";
  a += key.size();
  return msg.substr(a, msg.find(')', a) - a);
}

TEST_F(RunnerTest, AFailedWorkersLogOutlivesARemovedWorkDir) {
  backend_->work_dir_kept_ = false;
  o_.command.insert(o_.command.end(), {"--fail-rank", "1", "--fail-step", "1"});
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 3, "stop": true}])"));
  ASSERT_FALSE(s.ok());
  std::error_code ec;
  fs::remove_all(backend_->work_dir(), ec);  // as a private store directory is at exit
  const std::string path = OutputPath(s.status().message());
  EXPECT_EQ(path, o_.log_path + ".workers/worker-seg0-rank1.log") << s.status().message();
  Result<std::string> text = ReadFile(path);
  ASSERT_TRUE(text.ok()) << path;
  EXPECT_NE(text->find("worker 1: out of memory at step 1"), std::string::npos);
}

TEST_F(RunnerTest, AFailedWorkersLogInAKeptWorkDirIsNamedWhereItIs) {
  o_.command.insert(o_.command.end(), {"--fail-rank", "0", "--fail-step", "0"});
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 3, "stop": true}])"));
  ASSERT_FALSE(s.ok());
  const std::string path = OutputPath(s.status().message());
  EXPECT_EQ(path, backend_->work_dir() + "/worker-seg0-rank0.log");
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(o_.log_path + ".workers"));
}

TEST_F(RunnerTest, AnExistingLogIsAppendedTo) {
  const std::string old = R"({"step": 0, "loss": 7.0, "config": "old", "samples": [0]})"
                          "\n"
                          R"({"step": 9, "loss": 7.0, "config": "old", "samples": [72]})"
                          "\n";
  ASSERT_TRUE(WriteFileAtomic(o_.log_path, old).ok());
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 2, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::string text = *ReadFile(o_.log_path);
  EXPECT_EQ(text.substr(0, old.size()), old);  // kept
  // The summary covers this run's lines only.
  EXPECT_EQ(Steps(*s), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(s->steps[0].config, "tp=1,pp=1,dp=2");
}

// The real embedded store: a second run with the same --shm-dir and --job goes on
// where the first one stopped.
TEST_F(RunnerTest, EmbeddedStoreRunContinuesWhereTheLastStopped) {
  o_.shm_dir = dir_ + "/shm";
  o_.work_dir = dir_ + "/work";
  {
    auto st = OpenEmbeddedBackend(o_);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    ASSERT_TRUE(WriteFileAtomic(o_.schedule_path,
                                R"([{"step": 0, "config": "dp=2"}, {"step": 3, "stop": true}])")
                    .ok());
    auto s = RunSchedule(o_, *LoadRunInputs(o_), **st, launcher_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(s->resumed_version);
  }
  auto st = OpenEmbeddedBackend(o_);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_TRUE(WriteFileAtomic(o_.schedule_path,
                              R"([{"step": 0, "config": "dp=2"}, {"step": 2, "config": "tp=2"},
                                                    {"step": 5, "stop": true}])")
                  .ok());
  auto s = RunSchedule(o_, *LoadRunInputs(o_), **st, launcher_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->resumed_step, 3);
  ASSERT_EQ(launcher_.starts(), 4u);
  EXPECT_EQ(launcher_.Arg(2, "--start-step"), "3");
  EXPECT_EQ(launcher_.Arg(2, "--config"), "tp=2,pp=1,dp=1");
  EXPECT_EQ(Steps(*s), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(s->steps[0].samples, std::vector<int64_t>{24});
  auto cur = (*st)->Current(o_.job);
  ASSERT_TRUE(cur.ok() && *cur);
  EXPECT_EQ((**cur).info["step"], 5);
  EXPECT_EQ((**cur).info["samples_consumed"], 40);
  EXPECT_EQ((**cur).info["config"], "tp=2,pp=1,dp=1");
}

}  // namespace
}  // namespace tenplex::runtime
