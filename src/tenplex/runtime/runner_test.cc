// The runner's state machine (schedule loop, segments, commits, kills, failures)
// through its seams (runner_testing.h): a fake state backend that checks the version
// protocol, and /bin/sh workers that speak train.py's hand-off protocol (step lines,
// periodic commits, results), started through a launcher that records every command line.
#include <gtest/gtest.h>

#include "tenplex/runtime/runner_testing.h"

namespace tenplex::runtime {
namespace {

using nlohmann::json;
using runner_testing::RunnerTest;
using runner_testing::Steps;

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
  // End to end, from the last step to the first new one: the three parts one after another.
  EXPECT_GE(r.seconds, r.stop_seconds + r.transform_seconds + r.restart_seconds);
  std::vector<json> reconf = Events("reconfigure");
  ASSERT_EQ(reconf.size(), 1u);
  EXPECT_DOUBLE_EQ(reconf[0]["seconds"].get<double>(), r.seconds);
  EXPECT_EQ(Events("commit").size(), 4u);
}

// The backend was asked once to pre-size `to` while its committed state was at
// from_step in from_config.
void ExpectOnePresize(const runner_testing::FakeBackend& b, const std::string& to,
                      int64_t from_step, const std::string& from_config) {
  ASSERT_EQ(b.presizes.size(), 1u);
  EXPECT_EQ(b.presizes[0].config, to);
  EXPECT_EQ(b.presizes[0].from_step, from_step);
  EXPECT_EQ(b.presizes[0].from_config, from_config);
}

// Pre-sizing (StateBackend::PresizeAhead) asks for the next entry's config as soon as
// a segment has a committed state in its own config (its first periodic commit, or the
// state it loads), and the reconfiguration records what the backend reports of it.
TEST_F(RunnerTest, PresizesTheNextConfigOnceTheSegmentHasState) {
  o_.commit_every = 2;
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 4, "config": "tp=2"},
                                 {"step": 7, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  // From the commit after step 2 (dp=2); the last segment has no next config.
  ExpectOnePresize(*backend_, "tp=2,pp=1,dp=1", 2, "tp=1,pp=1,dp=2");
  ASSERT_EQ(s->reconfigurations.size(), 1u);
  EXPECT_EQ(s->reconfigurations[0].presize_poolable_bytes, 64);
  EXPECT_EQ(s->reconfigurations[0].presize_pooled_bytes, 48);
  EXPECT_DOUBLE_EQ(s->reconfigurations[0].presize_seconds, 0.5);
  EXPECT_EQ(json::parse(SummaryJson(*s))["reconfigurations"][0]["presize_pooled_bytes"], 48);
}

TEST_F(RunnerTest, PresizesFromTheLoadedStateAndNotBeforeAKillOrWhenOff) {
  // No periodic commits: the first segment never has a state to plan from; the second
  // loads the transformed one (step 2) and pre-sizes the third's config at its launch.
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 2, "config": "tp=2"},
                                 {"step": 4, "config": "dp=2"}, {"step": 5, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ExpectOnePresize(*backend_, "tp=1,pp=1,dp=2", 2, "tp=2,pp=1,dp=1");
  ASSERT_EQ(s->reconfigurations.size(), 2u);
  EXPECT_EQ(s->reconfigurations[0].presize_pooled_bytes, 0);
  EXPECT_EQ(s->reconfigurations[1].presize_pooled_bytes, 48);

  // A segment with a scheduled kill does not (the transform after it starts from the
  // survivors), and --no-presize turns it off.
  for (bool off : {false, true}) {
    backend_ = std::make_unique<runner_testing::FakeBackend>(dir_);
    o_.job = off ? "off" : "kill";
    o_.presize = !off;
    o_.commit_every = 1;
    const char* sched =
        off ? R"([{"step": 0, "config": "dp=2"}, {"step": 2, "config": "tp=2"},
                  {"step": 3, "stop": true}])"
            : R"([{"step": 0, "config": "dp=2"}, {"step": 3, "config": "tp=2", "kill_ranks": [1]},
                  {"step": 4, "stop": true}])";
    auto t = RunIt(json::parse(sched));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_EQ(backend_->transforms.size(), 1u) << sched;
    EXPECT_TRUE(backend_->presizes.empty()) << sched;
  }
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

}  // namespace
}  // namespace tenplex::runtime
