// The runner continuing a job (from its committed version, in another config, refusing
// state it cannot use), the failed worker's kept log and the run's log file, through the
// seams of runner_testing.h; and the real embedded store across two runs.
#include <gtest/gtest.h>

#include <filesystem>

#include "tenplex/runtime/runner_testing.h"

namespace tenplex::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using runner_testing::RunnerTest;
using runner_testing::Steps;

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
  json another = json::parse(*ReadFile(o_.model_path));
  another["name"] = "another-model";
  backend_->Preload(
      {{"model", another}, {"config", "tp=1,pp=1,dp=2"}, {"step", 1}, {"samples_consumed", 8}});
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
  EXPECT_EQ((**cur).info.step(), 5);
  EXPECT_EQ((**cur).info.samples_consumed(), 40);
  EXPECT_EQ((**cur).info.config().ToString(), "tp=2,pp=1,dp=1");
}

}  // namespace
}  // namespace tenplex::runtime
