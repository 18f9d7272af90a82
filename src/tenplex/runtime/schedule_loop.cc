#include "tenplex/runtime/schedule_loop.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "tenplex/runtime/report.h"
#include "tenplex/runtime/segment.h"
#include "tenplex/store/parse.h"
#include "tenplex/util/file.h"

namespace tenplex::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

Result<RunInputs> LoadRunInputs(const RunOptions& o) {
  if (o.command.empty())
    return InvalidArgument("no worker command given (tenplex run ... -- CMD ARGS)");
  std::string model_spec = o.model_path;
  for (std::size_t i = 0; model_spec.empty() && i + 1 < o.command.size(); ++i) {
    if (o.command[i] == "--model") model_spec = o.command[i + 1];
  }
  if (model_spec.empty())
    return InvalidArgument("no model: give --model M (or --model in the worker command)");
  RunInputs in;
  TP_ASSIGN_OR_RETURN(in.model, LoadModel(model_spec));
  TP_ASSIGN_OR_RETURN(std::string sched_text, ReadFile(o.schedule_path));
  auto sched = ParseSchedule(sched_text, in.model);
  if (!sched.ok()) return sched.status().WithContext(o.schedule_path);
  in.schedule = std::move(*sched);
  TP_RETURN_IF_ERROR(store::CheckJobName(o.job));
  return in;
}

namespace {

class ScheduleLoop {
 public:
  ScheduleLoop(const RunOptions& o, const RunInputs& in, StateBackend& st,
               ProcessLauncher& launcher)
      : o_(o), entries_(in.schedule), model_(in.model), st_(st), recorder_(o.log_path, &summary_) {
    env_ = SegmentEnv{&o_, &st_, &launcher, &recorder_};
  }

  Result<RunSummary> Run() {
    const auto t_run = Clock::now();
    TP_RETURN_IF_ERROR(Prepare());
    InterruptGuard interrupt_guard;
    cfg_ = entries_[0].config;
    bool done = false;
    while (!done) {
      TP_ASSIGN_OR_RETURN(done, RunSegment());
    }
    recorder_.Finish();
    TP_ASSIGN_OR_RETURN(summary_.steps, ReadStepLog(o_.log_path));
    if (!o_.baseline_log.empty())
      TP_RETURN_IF_ERROR(CompareWithBaseline(summary_, o_.baseline_log));
    summary_.seconds = Since(t_run);
    return summary_;
  }

 private:
  Status Prepare() {
    for (const ScheduleEntry& e : entries_) {
      Status s = st_.CheckHosts(e.kill_hosts);
      if (!s.ok()) return s.WithContext(o_.schedule_path);
    }
    const std::string work = st_.work_dir();
    std::error_code ec;
    fs::create_directories(work, ec);
    if (ec) return Internal("cannot create " + work + ": " + ec.message());
    // Start a fresh log.
    TP_RETURN_IF_ERROR(WriteFileAtomic(o_.log_path, ""));
    model_json_ = json::parse(ModelToJson(model_));
    return Status::Ok();
  }

  // Runs entry i_'s segment and moves on; true when the schedule is done.
  Result<bool> RunSegment() {
    TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(model_, cfg_));
    SegmentSpec spec;
    spec.index = segment_;
    spec.layout = &layout;
    spec.start = step_;
    spec.end = entries_[i_ + 1].step;
    spec.samples_consumed = samples_;
    spec.info = {{"model", model_json_},
                 {"config", cfg_.ToString()},
                 {"step", step_},
                 {"samples_consumed", samples_}};
    spec.committed = committed_;
    if (!kills_done_.count(i_ + 1)) {
      spec.kill_ranks = entries_[i_ + 1].kill_ranks;
      spec.kill_hosts = entries_[i_ + 1].kill_hosts;
    }
    Segment seg(env_, spec);
    TP_RETURN_IF_ERROR(seg.Run());
    if (seg.kill_struck()) kills_done_.insert(i_ + 1);
    committed_ = seg.committed();
    step_ = seg.step();
    samples_ = seg.samples_consumed();
    const bool failed = seg.state() == Segment::State::kKilled;
    ++i_;
    ++segment_;
    if (entries_[i_].stop && !failed) return true;
    if (entries_[i_].stop && failed) --i_;  // a failure in the last segment re-runs it
    const ParallelConfig next = entries_[i_].stop ? cfg_ : entries_[i_].config;
    if (next != cfg_ || failed) TP_RETURN_IF_ERROR(Reconfigure(seg, spec.end, next, failed));
    cfg_ = next;
    return false;
  }

  // Records the change to `next` (after a failure: the restart) and transforms the
  // committed version when the config changes or lost hosts' state must be re-placed.
  Status Reconfigure(const Segment& seg, int64_t end, const ParallelConfig& next, bool failed) {
    const bool replace = !seg.lost_hosts().empty();
    ReconfigureRecord rec;
    rec.step = step_;
    rec.from = cfg_.ToString();
    rec.to = next.ToString();
    rec.after_failure = failed;
    if (failed) {
      rec.killed = seg.killed_ranks();
      rec.failed_step = end - 1;
      rec.lost_steps = end - 1 - step_;
    }
    rec.stop_seconds = seg.stop_seconds();
    if (committed_ && (next != cfg_ || replace)) {
      auto t0 = Clock::now();
      auto ts = st_.Transform(o_.job, next);
      if (!ts.ok())
        return ts.status().WithContext("transform " + cfg_.ToString() + " -> " + next.ToString());
      committed_ = ts->version;
      rec.transform_seconds = Since(t0);
      rec.bytes_moved = ts->bytes_moved;
      rec.bytes_total = ts->bytes_total;
      rec.bytes_in_place = ts->bytes_in_place;
    }
    recorder_.SetPending(rec, seg.kill_time());
    return Status::Ok();
  }

  const RunOptions& o_;
  const std::vector<ScheduleEntry>& entries_;
  const Model& model_;
  StateBackend& st_;
  RunSummary summary_;
  RunRecorder recorder_;
  SegmentEnv env_;
  json model_json_;
  std::optional<uint64_t> committed_;
  int64_t step_ = 0, samples_ = 0;
  std::set<std::size_t> kills_done_;
  std::size_t i_ = 0;
  int segment_ = 0;
  ParallelConfig cfg_;
};

}  // namespace

Result<RunSummary> RunSchedule(const RunOptions& o, const RunInputs& in, StateBackend& st,
                               ProcessLauncher& launcher) {
  return ScheduleLoop(o, in, st, launcher).Run();
}

}  // namespace tenplex::runtime
