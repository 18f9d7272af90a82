// `tenplex run --warm` through its seams: the real embedded store, the real launcher
// (counting starts and reaps) and /bin/sh workers that speak the warm protocol of
// warm.h (park, take the next segment's arguments, exit, abort) and train.py's
// hand-off protocol (step lines, .result files), logging their pid with every step.
#include "tenplex/runtime/warm.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tenplex/model/gpt.h"
#include "tenplex/runtime/backend.h"
#include "tenplex/runtime/runner_testing.h"
#include "tenplex/runtime/schedule_loop.h"
#include "tenplex/util/file.h"

namespace tenplex::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The embedded store, recording at each Transform which warm workers' messages (the
// next segment's arguments) the runner had written by then.
class RecordingBackend : public StateBackend {
 public:
  explicit RecordingBackend(std::unique_ptr<StateBackend> st) : st_(std::move(st)) {}
  std::string work_dir() const override { return st_->work_dir(); }
  Result<std::optional<Committed>> Current(const std::string& job) override {
    return st_->Current(job);
  }
  Result<uint64_t> BeginLayout(const std::string& job, const Layout& layout,
                               io::StateInfo info) override {
    return st_->BeginLayout(job, layout, std::move(info));
  }
  Result<std::vector<std::map<std::string, std::string>>> Files(const std::string& job, uint64_t v,
                                                                const Layout& layout) override {
    return st_->Files(job, v, layout);
  }
  Status Commit(const std::string& job, uint64_t v, const io::StateInfo& info) override {
    return st_->Commit(job, v, info);
  }
  void Drop(const std::string& job, uint64_t v) override { st_->Drop(job, v); }
  Result<Moved> Transform(const std::string& job, const ParallelConfig& to) override {
    std::set<std::string> sent;
    for (const auto& e : fs::directory_iterator(work_dir())) {
      const std::string name = e.path().filename().string();
      if (name.rfind("warm-w", 0) == 0 && e.path().extension() == ".json") sent.insert(name);
    }
    messages_at_transform.push_back(std::move(sent));
    return st_->Transform(job, to);
  }
  std::vector<std::set<std::string>> messages_at_transform;

 private:
  std::unique_ptr<StateBackend> st_;
};

// One segment as train.py runs it (rank 0 logs {"step", "loss", "config", "samples",
// "pid"} and writes each .result; the others wait for it, train.py's barrier), then,
// with --warm-control P: P<n>.parked, wait for P<n>.json, exit on {"exit": true} or
// run the next segment with its arguments. While it waits for a step or a barrier,
// P<n>.abort (a peer failed) parks it at once (but the rank $TENPLEX_TEST_STUCK_RANK).
constexpr char kWarmWorker[] = R"SH(
n=1
# A rank named by TENPLEX_TEST_STUCK_RANK never sees an abort (as one stuck in a
# collective on its broken connections would not).
aborted() {
  [ -n "$ctl" ] && [ -f "$ctl$n.abort" ] && [ "$rank" != "${TENPLEX_TEST_STUCK_RANK:--1}" ]
}
segment() {
  rank=0; start=0; steps=0; log=; out=; cfg=; in=; ctl=
  while [ $# -gt 0 ]; do
    case "$1" in
      --world-rank) rank=$2; shift;;
      --start-step) start=$2; shift;;
      --steps) steps=$2; shift;;
      --log) log=$2; shift;;
      --state-out) out=$2; shift;;
      --config) cfg=$2; shift;;
      --state-in) in=$2; shift;;
      --warm-control) ctl=$2; shift;;
    esac
    shift
  done
  samples=0
  if [ -n "$in" ] && [ -n "$ctl" ]; then
    while [ ! -f "$in" ]; do sleep 0.005; done  # warm: written once the transform is done
  fi
  if [ -n "$in" ]; then samples=$(sed -n 's/.*"samples_consumed":\([0-9]*\).*/\1/p' "$in"); fi
  step=$start; end=$((start + steps))
  while [ $step -lt $end ]; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      if aborted; then return 1; fi
      sleep 0.02
    done
    if [ "$rank" = 0 ]; then
      printf '{"step": %d, "loss": %d.5, "config": "%s", "samples": [%d], "pid": %d}\n' \
        $step $((100 - step)) "$cfg" $samples $$ >> "$log"
    fi
    step=$((step + 1)); samples=$((samples + 8))
  done
  while [ ! -f "$out" ]; do sleep 0.005; done
  if [ "$rank" = 0 ]; then
    printf '{"step": %d, "samples_consumed": %d}' $step $samples > "$out.result.tmp"
    mv "$out.result.tmp" "$out.result"
  else
    while [ ! -f "$out.result" ]; do
      if aborted; then return 1; fi
      sleep 0.005
    done
  fi
  return 0
}
spare=0; prev=
for a in "$@"; do
  if [ "$prev" = --warm-control ]; then ctl=$a; fi
  if [ "$a" = --warm-spare ]; then spare=1; fi
  prev=$a
done
if [ $spare = 0 ]; then segment "$@" || true; fi
while [ -n "$ctl" ]; do
  : > "$ctl$n.parked"
  while [ ! -f "$ctl$n.json" ]; do sleep 0.005; done
  msg=$(cat "$ctl$n.json"); n=$((n + 1))
  case "$msg" in *exit*) exit 0;; esac
  set -- $(echo "$msg" | sed -e 's/^{"args":\[//' -e 's/\]}$//' -e 's/","/ /g' -e 's/"//g')
  segment "$@" || true
done
)SH";

class WarmRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runner_testing::PrepareRunDir("warm", kWarmWorker, dir_, o_);
    if (HasFatalFailure()) return;
    o_.shm_dir = dir_ + "/store";
    o_.work_dir = dir_ + "/work";
    o_.warm = true;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Result<RunSummary> RunIt(const json& schedule) {
    TP_RETURN_IF_ERROR(WriteFileAtomic(o_.schedule_path, schedule.dump()));
    TP_ASSIGN_OR_RETURN(RunInputs in, LoadRunInputs(o_));
    TP_ASSIGN_OR_RETURN(std::unique_ptr<StateBackend> st, OpenEmbeddedBackend(o_));
    RecordingBackend rec(std::move(st));
    auto s = RunSchedule(o_, in, rec, launcher_);
    messages_at_transform_ = rec.messages_at_transform;
    return s;
  }
  // The arguments of every message the runner sent: {file name: args}.
  std::map<std::string, json> Messages() {
    std::map<std::string, json> out;
    for (const auto& e : fs::directory_iterator(o_.work_dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("warm-w", 0) != 0 || e.path().extension() != ".json") continue;
      auto text = ReadFile(e.path().string());
      if (!text.ok()) continue;
      json m = json::parse(*text, nullptr, false);
      if (m.is_object() && m.contains("args")) out[name] = m["args"];
    }
    return out;
  }
  // The log's lines: the last step line per step, and the runner's events.
  std::map<int64_t, json> Steps() {
    std::map<int64_t, json> out;
    std::ifstream f(o_.log_path);
    for (std::string line; std::getline(f, line);) {
      json j = json::parse(line, nullptr, false);
      if (j.is_object() && !j.contains("event")) out[j["step"].get<int64_t>()] = j;
    }
    return out;
  }
  std::vector<json> Events(const std::string& name) {
    return runner_testing::LogEvents(o_.log_path, name);
  }
  bool AllReaped() const { return launcher_.AllReaped(); }

  std::string dir_;
  RunOptions o_;
  runner_testing::RecordingLauncher launcher_;
  std::vector<std::set<std::string>> messages_at_transform_;
};

std::string ArgOf(const json& args, const std::string& flag) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag) return args[i + 1].get<std::string>();
  }
  return "";
}

TEST_F(WarmRunTest, WorkersLiveThroughShrinkingAndGrowing) {
  // 4 workers; 2 (ranks 0, 1 stay, 2 and 3 exit); 2 again; 4 (2 new ones).
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=4"}, {"step": 2, "config": "tp=2"},
                                 {"step": 4, "config": "dp=2"}, {"step": 6, "config": "tp=2,dp=2"},
                                 {"step": 8, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::map<int64_t, json> steps = Steps();
  ASSERT_EQ(steps.size(), 8u);
  for (int64_t k = 0; k < 8; ++k) {
    EXPECT_EQ(steps[k]["samples"], json::array({8 * k})) << "step " << k;
  }
  EXPECT_EQ(steps[2]["config"], "tp=2,pp=1,dp=1");
  EXPECT_EQ(steps[6]["config"], "tp=2,pp=1,dp=2");
  // Rank 0 is the same process all along; only the 2 added ranks of the last change
  // started new processes.
  std::set<int64_t> pids;
  for (const auto& [k, j] : steps) pids.insert(j["pid"].get<int64_t>());
  EXPECT_EQ(pids.size(), 1u) << "rank 0 ran in several processes";
  EXPECT_EQ(static_cast<pid_t>(*pids.begin()), launcher_.pids.at(0));
  ASSERT_EQ(launcher_.pids.size(), 6u);
  for (const auto& argv : launcher_.argvs) {
    EXPECT_NE(std::find(argv.begin(), argv.end(), "--warm-control"), argv.end());
  }
  // The added ranks 2 and 3 of the last segment were started ahead, as spares while
  // dp=2 trained, and got their arguments (from the committed state) as messages.
  for (int k = 4; k < 6; ++k) {
    const auto& argv = launcher_.argvs[k];
    EXPECT_NE(std::find(argv.begin(), argv.end(), "--warm-spare"), argv.end());
    EXPECT_EQ(std::find(argv.begin(), argv.end(), "--config"), argv.end());
    auto msg = ReadFile(o_.work_dir + "/warm-w" + std::to_string(k) + "-1.json");
    ASSERT_TRUE(msg.ok()) << msg.status().ToString();
    const json args = json::parse(*msg)["args"];
    auto at = [&](const std::string& flag) { return ArgOf(args, flag); };
    EXPECT_EQ(at("--world-rank"), std::to_string(k - 2));
    EXPECT_EQ(at("--config"), "tp=2,pp=1,dp=2");
    EXPECT_EQ(at("--start-step"), "6");
    EXPECT_NE(at("--state-in"), "");
  }
  EXPECT_EQ(s->reconfigurations.size(), 3u);
  for (const ReconfigureRecord& r : s->reconfigurations) {
    EXPECT_GT(r.restart_seconds, 0);
    // End to end: the stop, then the restart, which holds the (overlapped) transform.
    EXPECT_GE(r.seconds, r.stop_seconds + r.restart_seconds);
    EXPECT_GE(r.restart_seconds, r.transform_seconds);
  }
  EXPECT_EQ(Events("reconfigure").size(), 3u);
  EXPECT_TRUE(AllReaped()) << "a worker outlived the run";
}

TEST_F(WarmRunTest, TheTransformRunsWhileTheWorkersRejoin) {
  // Every change's transform starts after each worker of the new world (parked ones,
  // spares, ones started new) got its arguments, which name a --state-in file the
  // runner writes after the transform.
  auto s = RunIt(json::parse(R"([{"step": 0, "config": "dp=2"}, {"step": 2, "config": "tp=2"},
                                 {"step": 4, "config": "dp=3"}, {"step": 6, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(messages_at_transform_.size(), 2u);
  std::map<std::string, json> messages = Messages();
  for (int seg = 1; seg <= 2; ++seg) {
    const std::string in = "/state-in-" + std::to_string(seg) + ".json";
    int ranks = 0;
    for (const auto& [name, args] : messages) {
      const std::string state_in = ArgOf(args, "--state-in");
      if (state_in.size() < in.size() || state_in.substr(state_in.size() - in.size()) != in)
        continue;
      ++ranks;
      EXPECT_TRUE(messages_at_transform_[seg - 1].count(name))
          << name << " (segment " << seg << ") was sent after the transform began";
    }
    EXPECT_EQ(ranks, seg == 1 ? 2 : 3) << "segment " << seg;
  }
  std::map<int64_t, json> steps = Steps();
  ASSERT_EQ(steps.size(), 6u);
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(steps[k]["samples"], json::array({8 * k}));
  EXPECT_TRUE(AllReaped());
}

TEST_F(WarmRunTest, SurvivorsOfAKillParkAndGoOn) {
  auto s = RunIt(json::parse(
      R"([{"step": 0, "config": "dp=4"}, {"step": 4, "config": "dp=3", "kill_ranks": [1]},
          {"step": 6, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<json> fails = Events("failure");
  ASSERT_EQ(fails.size(), 1u);
  EXPECT_EQ(fails[0]["killed_ranks"], json::array({1}));
  std::map<int64_t, json> steps = Steps();
  ASSERT_EQ(steps.size(), 6u);
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(steps[k]["samples"], json::array({8 * k}));
  EXPECT_EQ(steps[5]["config"], "tp=1,pp=1,dp=3");
  // The 3 survivors are the new world: no process started after the first 4.
  EXPECT_EQ(launcher_.pids.size(), 4u);
  EXPECT_EQ(steps[5]["pid"].get<int64_t>(), launcher_.pids.at(0));
  ASSERT_EQ(s->reconfigurations.size(), 1u);
  EXPECT_TRUE(s->reconfigurations[0].after_failure);
  EXPECT_EQ(Events("recovered").size(), 1u);
  EXPECT_TRUE(AllReaped());
}

// A survivor that does not park after the abort (stuck, as in a collective on its
// shut connections) is killed alone once the park deadline (min(30 s, hang_seconds))
// passed; the survivors that parked stay alive and make the next world with one new
// worker in the stuck one's place.
TEST_F(WarmRunTest, OnlyTheSurvivorThatDoesNotParkIsKilled) {
  o_.hang_seconds = 3;
  ASSERT_EQ(setenv("TENPLEX_TEST_STUCK_RANK", "3", 1), 0);
  auto s = RunIt(json::parse(
      R"([{"step": 0, "config": "dp=4"}, {"step": 4, "config": "dp=3", "kill_ranks": [1]},
          {"step": 6, "stop": true}])"));
  unsetenv("TENPLEX_TEST_STUCK_RANK");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_GE(launcher_.pids.size(), 4u);
  // Killed: rank 1 (the schedule), then rank 3 (did not park); never ranks 0 and 2.
  ASSERT_GE(launcher_.killed.size(), 2u);
  EXPECT_EQ(launcher_.killed[0], launcher_.pids[1]);
  EXPECT_EQ(launcher_.killed[1], launcher_.pids[3]);
  for (pid_t k : launcher_.killed) {
    EXPECT_NE(k, launcher_.pids[0]);
    EXPECT_NE(k, launcher_.pids[2]);
  }
  // One worker started for the next world (dp=3: the two that parked and it).
  EXPECT_EQ(launcher_.pids.size(), 5u);
  std::map<int64_t, json> steps = Steps();
  ASSERT_EQ(steps.size(), 6u);
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(steps[k]["samples"], json::array({8 * k}));
  EXPECT_EQ(steps[5]["config"], "tp=1,pp=1,dp=3");
  EXPECT_EQ(steps[5]["pid"].get<int64_t>(), launcher_.pids.at(0));
  EXPECT_TRUE(AllReaped());
}

TEST_F(WarmRunTest, SurvivorsTooFewForTheNextWorldAreJoinedByNewWorkers) {
  auto s = RunIt(json::parse(
      R"([{"step": 0, "config": "tp=2"}, {"step": 3, "config": "dp=2", "kill_ranks": [0]},
          {"step": 4, "stop": true}])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(launcher_.pids.size(), 3u);  // 2, then 1 for the killed rank
  std::map<int64_t, json> steps = Steps();
  ASSERT_EQ(steps.size(), 4u);
  // Rank 1 survived and is rank 0 of the new world.
  EXPECT_EQ(steps[3]["pid"].get<int64_t>(), launcher_.pids.at(1));
  EXPECT_TRUE(AllReaped());
}

TEST(WarmPoolTest, PublishFileReplacesWholeAndLeavesNoTemporaries) {
  char tmpl[] = "/tmp/tenplex-warm-publish-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, path = dir + "/m.json";
  ASSERT_TRUE(PublishFile(path, R"({"args": ["a"]})").ok());
  EXPECT_EQ(*ReadFile(path), R"({"args": ["a"]})");
  const std::string big(1 << 20, 'x');  // more than one write() may take
  ASSERT_TRUE(PublishFile(path, big).ok());
  EXPECT_EQ(*ReadFile(path), big);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.path() == path ? 1 : 100;
  EXPECT_EQ(entries, 1) << "a temporary file was left beside " << path;
  Status bad = PublishFile(dir + "/no/such/dir/m.json", "{}");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("no/such/dir"), std::string::npos) << bad.ToString();
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(WarmPoolTest, MessagesAndExit) {
  char tmpl[] = "/tmp/tenplex-warm-pool-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  runner_testing::RecordingLauncher launcher;
  {
    WarmPool pool(&launcher, dir);
    WarmWorker a = pool.NewWorker(), b = pool.NewWorker();
    EXPECT_NE(a.prefix, b.prefix);
    EXPECT_EQ(a.Path("json"), a.prefix + "1.json");
    // b exits at once (a zombie until reaped): Take reaps and skips it.
    auto pa = launcher.Spawn({"/bin/sh", "-c",
                              "while [ ! -f " + a.Path("json") +
                                  " ]; do sleep 0.01; done; "
                                  "cat " +
                                  a.Path("json") + " > " + dir +
                                  "/got; "
                                  "while [ ! -f " +
                                  a.prefix + "2.json ]; do sleep 0.01; done"},
                             dir + "/a.log");
    auto pb = launcher.Spawn({"/bin/true"}, dir + "/b.log");
    ASSERT_TRUE(pa.ok() && pb.ok());
    a.pid = *pa;
    b.pid = *pb;
    for (int i = 0; i < 500; ++i) {  // until b is a zombie
      auto stat = ReadFile("/proc/" + std::to_string(b.pid) + "/stat");
      if (stat.ok() && stat->find(") Z ") != std::string::npos) break;
      ::usleep(10000);
    }
    pool.Park({b, a});
    EXPECT_EQ(pool.parked(), 2u);
    std::optional<WarmWorker> t = pool.Take();
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->pid, a.pid);
    EXPECT_TRUE(launcher.reaped.count(b.pid));
    EXPECT_EQ(pool.parked(), 0u);
    EXPECT_FALSE(pool.Take().has_value());
    WarmWorker w = *t;
    ASSERT_TRUE(pool.Send(w, {"--config", "tp=2"}).ok());
    EXPECT_EQ(w.seq, 1);
    EXPECT_EQ(w.Path("json"), w.prefix + "2.json");
    ASSERT_TRUE(pool.Abort(w).ok());
    EXPECT_TRUE(fs::exists(w.prefix + "2.abort"));
    EXPECT_FALSE(WarmPool::IsParked(w));
    pool.Park({w});
    pool.Release(true);  // writes a's exit message (2.json) and reaps it
    EXPECT_EQ(pool.parked(), 0u);
    EXPECT_TRUE(launcher.reaped.count(a.pid));
    auto got = ReadFile(dir + "/got");
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(json::parse(*got), json({{"args", {"--config", "tp=2"}}}));
    auto bye = ReadFile(a.prefix + "2.json");
    ASSERT_TRUE(bye.ok());
    EXPECT_EQ(json::parse(*bye), json({{"exit", true}}));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace tenplex::runtime
