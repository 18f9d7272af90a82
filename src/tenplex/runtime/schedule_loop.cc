#include "tenplex/runtime/schedule_loop.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "tenplex/policy/policy.h"
#include "tenplex/runtime/rebalance.h"
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
  auto sched = ParseSchedule(
      sched_text, in.model,
      [&](int gpus, const std::string& profile, const std::string& memory) -> Result<ChosenConfig> {
        TP_ASSIGN_OR_RETURN(policy::WorkerChoice c,
                            policy::ChooseForWorkers(in.model, o.command, gpus, profile, memory));
        return ChosenConfig{c.config, c.args};
      });
  if (!sched.ok()) return sched.status().WithContext(o.schedule_path);
  in.schedule = std::move(*sched);
  TP_RETURN_IF_ERROR(store::CheckJobName(o.job));
  return in;
}

namespace {

// --rebalance --warm, before any reconfiguration was measured: what a warm re-join (new
// process groups, the state re-mapped) is assumed to cost besides the transform; the
// demo's measured 0.35-0.70 s end to end (docs/benchmarks.md section 4).
constexpr double kWarmRejoinPriorSeconds = 0.5;

class ScheduleLoop {
 public:
  ScheduleLoop(const RunOptions& o, const RunInputs& in, StateBackend& st,
               ProcessLauncher& launcher)
      : o_(o), entries_(in.schedule), model_(in.model), st_(st), recorder_(o.log_path, &summary_) {
    env_ = SegmentEnv{
        &o_,    &st_, &launcher, &recorder_, st.work_dir_kept() ? "" : o.log_path + ".workers",
        nullptr};
    if (o.warm) {
      pool_.emplace(&launcher, st.work_dir());
      env_.pool = &*pool_;
    }
  }

  Result<RunSummary> Run() {
    const auto t_run = Clock::now();
    TP_RETURN_IF_ERROR(Prepare());
    InterruptGuard interrupt_guard;
    cfg_ = entries_[0].config;
    TP_ASSIGN_OR_RETURN(bool done, Resume());
    while (!done) {
      TP_ASSIGN_OR_RETURN(done, RunSegment());
    }
    if (pool_) pool_->Release(true);  // the last segment's workers exit
    recorder_.Finish();
    TP_ASSIGN_OR_RETURN(summary_.steps, ReadStepLog(o_.log_path, log_offset_));
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
    // The log is appended to (as train.py does); this run's lines start here.
    struct stat st;
    if (::stat(o_.log_path.c_str(), &st) == 0) log_offset_ = static_cast<uint64_t>(st.st_size);
    TP_RETURN_IF_ERROR(CreateLog(o_.log_path));
    model_text_ = ModelToJson(model_);
    return Status::Ok();
  }

  void Notify(const std::string& message) const {
    if (o_.notify) o_.notify(message);
  }

  // Continues from the job's committed version, if the store holds one: its step,
  // samples and config; the schedule entry follows from the step. True when the
  // schedule has nothing left to run.
  Result<bool> Resume() {
    TP_ASSIGN_OR_RETURN(std::optional<StateBackend::Committed> cur, st_.Current(o_.job));
    if (!cur) return false;
    const io::StateInfo& info = cur->info;
    const std::string what =
        "version " + std::to_string(cur->version) + " of job '" + o_.job + "' in the store";
    Result<io::StateInfo::Position> pos = info.ResumePosition(what);
    if (pos.ok() && !pos->samples_consumed) {
      pos = FailedPrecondition(what + " has no samples_consumed in its info");
    }
    if (!pos.ok()) {
      return FailedPrecondition(pos.status().message() +
                                ", so the run cannot continue it: give another --job (or "
                                "remove the job)");
    }
    if (ModelToJson(info.model()) != model_text_) {
      return FailedPrecondition(
          what + " holds another model than this run's; give another --job (or remove the job)");
    }
    committed_ = cur->version;
    step_ = pos->step;
    samples_ = *pos->samples_consumed;
    cfg_ = info.config();
    summary_.resumed_version = cur->version;
    summary_.resumed_step = step_;
    TP_RETURN_IF_ERROR(AppendLogLine(o_.log_path, {{"event", "resume"},
                                                   {"version", cur->version},
                                                   {"step", step_},
                                                   {"samples_consumed", samples_},
                                                   {"config", cfg_.ToString()}}));
    if (step_ >= entries_.back().step) {
      Notify("job '" + o_.job + "' is at step " + std::to_string(step_) + " (committed version " +
             std::to_string(cur->version) + "); the schedule ends at step " +
             std::to_string(entries_.back().step) + ": nothing to run");
      return true;
    }
    while (entries_[i_ + 1].step <= step_) ++i_;
    Notify("continuing job '" + o_.job + "' from its committed version " +
           std::to_string(cur->version) + ": step " + std::to_string(step_) + ", " +
           std::to_string(samples_) + " samples consumed, config " + cfg_.ToString());
    const ParallelConfig want = EntryConfig(i_);
    if (want == cfg_) return false;
    ReconfigureRecord rec;
    rec.step = step_;
    rec.from = cfg_.ToString();
    rec.to = want.ToString();
    const auto t_begin = Clock::now();
    TP_RETURN_IF_ERROR(TransformTo(want, rec));
    recorder_.SetPending(rec, t_begin);
    cfg_ = want;
    return false;
  }

  // Runs entry i_'s segment and moves on; true when the schedule is done.
  Result<bool> RunSegment() {
    if (entries_[i_].slowdown) slowdown_ = *entries_[i_].slowdown;
    TP_ASSIGN_OR_RETURN(Layout layout, MakeLayout(model_, cfg_));
    SegmentSpec spec;
    spec.index = segment_;
    spec.layout = &layout;
    spec.start = step_;
    spec.end = entries_[i_ + 1].step;
    spec.samples_consumed = samples_;
    spec.info = io::StateInfo::Make(model_, cfg_);
    spec.info.set_step(step_);
    spec.info.set_samples_consumed(samples_);
    spec.committed = committed_;
    spec.commit_every = o_.commit_every;
    spec.slowdown = SlowdownArg(slowdown_);
    spec.worker_args = entries_[i_].worker_args;
    if (o_.rebalance) {
      const int64_t w = o_.rebalance_window;
      spec.commit_every = o_.commit_every > 0 ? std::min(o_.commit_every, w) : w;
      spec.stop_after_commit = [this, start = spec.start](int64_t step) {
        return CheckRebalance(start, step);
      };
      struct stat st;
      seg_log_offset_ = ::stat(o_.log_path.c_str(), &st) == 0 ? st.st_size : 0;
      t_segment_ = Clock::now();
    }
    if (!kills_done_.count(i_ + 1)) {
      spec.kill_ranks = entries_[i_ + 1].kill_ranks;
      spec.kill_hosts = entries_[i_ + 1].kill_hosts;
    }
    // --warm: the next entry's world, so that workers it adds start ahead (spares).
    if (o_.warm && !entries_[i_ + 1].stop) spec.next_world = EntryConfig(i_ + 1).world_size();
    // The next entry's config is known: its new tensors are made ahead while this
    // segment trains. Not before a scheduled kill (the next transform starts from fewer
    // hosts) or with --rebalance (the next split is decided at a stop).
    if (o_.presize && !o_.rebalance && !entries_[i_ + 1].stop && spec.kill_ranks.empty() &&
        spec.kill_hosts.empty()) {
      const ParallelConfig next = EntryConfig(i_ + 1);
      if (next != cfg_) spec.on_state = [this, next] { st_.PresizeAhead(o_.job, next); };
    }
    if (deferred_) {
      spec.transform_in = [this]() -> Result<uint64_t> {
        DeferredTransform d = std::move(*deferred_);
        deferred_.reset();
        TP_RETURN_IF_ERROR(TransformTo(d.to, d.rec));
        if (d.rebalance) TP_RETURN_IF_ERROR(LogRebalance(*d.rebalance, d.rec));
        recorder_.SetPending(d.rec, d.t_begin);
        return *committed_;
      };
    }
    Segment seg(env_, spec);
    TP_RETURN_IF_ERROR(seg.Run());
    if (seg.kill_struck()) kills_done_.insert(i_ + 1);
    committed_ = seg.committed();
    step_ = seg.step();
    samples_ = seg.samples_consumed();
    if (seg.state() == Segment::State::kStopped) {  // a rebalance, in this entry
      ++segment_;
      TP_RETURN_IF_ERROR(Rebalance(seg));
      return false;
    }
    const bool failed = seg.state() == Segment::State::kKilled;
    ++i_;
    ++segment_;
    if (entries_[i_].stop && !failed) return true;
    if (entries_[i_].stop && failed) --i_;  // a failure in the last segment re-runs it
    const ParallelConfig next = entries_[i_].stop ? cfg_ : EntryConfig(i_);
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
    const bool transform = committed_ && (next != cfg_ || replace);
    if (transform && pool_) {
      deferred_ = DeferredTransform{next, rec, seg.stop_begin(), std::nullopt};
      return Status::Ok();
    }
    if (transform) TP_RETURN_IF_ERROR(TransformTo(next, rec));
    recorder_.SetPending(rec, seg.stop_begin());
    return Status::Ok();
  }

  // Entry i's config; with --rebalance the current split when the entry differs from it
  // only in weights or layers (a rebalanced split outlives the entries that follow).
  ParallelConfig EntryConfig(std::size_t i) const {
    const ParallelConfig& e = entries_[i].config;
    if (o_.rebalance && e.tp == cfg_.tp && e.dp == cfg_.dp && e.pp == cfg_.pp &&
        e.zero == cfg_.zero)
      return cfg_;
    return e;
  }

  // After the periodic commit at `step` of the segment that began at `start`: whether
  // the rebalance policy wants another split (kept in rebalance_ for Rebalance()).
  bool CheckRebalance(int64_t start, int64_t step) {
    auto log = ReadStepLog(o_.log_path, seg_log_offset_);
    if (!log.ok()) return false;
    std::vector<std::vector<double>> window;
    double worked = 0;
    for (const StepRecord& r : *log) {
      if (r.step < start || r.step >= step) continue;
      worked += r.seconds;
      if (r.step > start && !r.rank_seconds.empty()) window.push_back(r.rank_seconds);
    }
    if (window.empty() && step - start > 1 && !warned_) {
      warned_ = true;
      Notify("--rebalance: the workers log no rank_seconds; nothing to rebalance on");
    }
    if (static_cast<int64_t>(window.size()) > o_.rebalance_window)
      window.erase(window.begin(), window.end() - o_.rebalance_window);
    // The cost of a reconfiguration: measured at the last one (stop, transform, restart
    // less the step it ran); before any, this segment's own start-up (the seconds since
    // its launch not spent in steps) plus the last transform's seconds, or with --warm
    // (no new processes) the step the stop breaks off plus kWarmRejoinPriorSeconds.
    double cost = Since(t_segment_) - worked + last_transform_s_;
    if (pool_) cost = worked / (step - start) + kWarmRejoinPriorSeconds + last_transform_s_;
    if (!summary_.reconfigurations.empty()) {
      const ReconfigureRecord& r = summary_.reconfigurations.back();
      cost = r.seconds - worked / (step - start);  // end to end (--warm overlaps the transform)
    }
    if (o_.rebalance_cost >= 0) cost = o_.rebalance_cost;
    RebalancePolicy policy;
    policy.min_step_gain = o_.rebalance_min_gain;
    // The splits measured before in this entry (same speeds) give the fixed part.
    if (history_entry_ != i_) {
      history_.clear();
      history_entry_ = i_;
    }
    auto d =
        DecideConfigRebalance(model_, cfg_, GlobalBatch(), window, entries_[i_ + 1].step - step,
                              std::max(0.0, cost), policy, history_);
    if (!d.ok()) {
      Notify("--rebalance: " + d.status().message());
      return false;
    }
    rebalance_ = *d;
    if (!d->decision.rebalance && !(d->to == cfg_) && !d->decision.rank_seconds.empty()) {
      // A better split exists but does not pay (yet): say why, once per segment.
      if (skipped_logged_ != start) {
        skipped_logged_ = start;
        (void)AppendLogLine(o_.log_path, {{"event", "rebalance_skipped"},
                                          {"step", step},
                                          {"config", cfg_.ToString()},
                                          {"best", d->to.ToString()},
                                          {"predicted_gain_s", d->decision.predicted_gain_s},
                                          {"cost_s", d->decision.cost_s},
                                          {"reason", d->decision.reason}});
      }
    }
    return d->decision.rebalance;
  }

  // --global-batch-size of the worker command (train.py's default 8).
  int64_t GlobalBatch() const {
    for (std::size_t i = 0; i + 1 < o_.command.size(); ++i) {
      if (o_.command[i] == "--global-batch-size") return std::atoll(o_.command[i + 1].c_str());
    }
    return 8;
  }

  // Transforms the state committed at the stop into the rebalanced split and logs it
  // (--warm: the next segment does, while the parked workers re-join).
  Status Rebalance(const Segment& seg) {
    ConfigRebalance r = std::move(*rebalance_);
    rebalance_.reset();
    ReconfigureRecord rec;
    rec.step = step_;
    rec.from = cfg_.ToString();
    rec.to = r.to.ToString();
    rec.stop_seconds = seg.stop_seconds();
    history_.push_back(r.decision.measured);
    cfg_ = r.to;
    if (pool_) {
      deferred_ = DeferredTransform{r.to, rec, seg.stop_begin(), std::move(r)};
      return Status::Ok();
    }
    TP_RETURN_IF_ERROR(TransformTo(r.to, rec));
    TP_RETURN_IF_ERROR(LogRebalance(r, rec));
    recorder_.SetPending(rec, seg.stop_begin());
    return Status::Ok();
  }

  // The rebalance event of r, whose transform rec recorded.
  Status LogRebalance(const ConfigRebalance& r, const ReconfigureRecord& rec) {
    last_transform_s_ = rec.transform_seconds;
    TP_RETURN_IF_ERROR(
        AppendLogLine(o_.log_path, {{"event", "rebalance"},
                                    {"step", rec.step},
                                    {"from", rec.from},
                                    {"to", rec.to},
                                    {"predicted_gain_s", r.decision.predicted_gain_s},
                                    {"cost_s", r.decision.cost_s},
                                    {"rank_seconds", r.decision.rank_seconds},
                                    {"current_step_s", r.decision.current_step_s},
                                    {"predicted_step_s", r.decision.predicted_step_s},
                                    {"fixed_s", r.decision.speed.fixed_s},
                                    {"per_work_s", r.decision.speed.per_work_s},
                                    {"fitted_ranks", r.decision.speed.fitted_ranks},
                                    {"bytes_moved", rec.bytes_moved},
                                    {"bytes_cross_host", last_cross_host_[0]},
                                    {"cross_host_lower_bound", last_cross_host_[1]},
                                    {"transform_seconds", rec.transform_seconds}}));
    Notify("rebalanced at step " + std::to_string(rec.step) + ": " + rec.from + " -> " + rec.to);
    return Status::Ok();
  }

  // Transforms the committed version into `next`, recording time and bytes in rec.
  Status TransformTo(const ParallelConfig& next, ReconfigureRecord& rec) {
    auto t0 = Clock::now();
    auto ts = st_.Transform(o_.job, next);
    if (!ts.ok())
      return ts.status().WithContext("transform " + rec.from + " -> " + next.ToString());
    committed_ = ts->version;
    rec.transform_seconds = Since(t0);
    rec.bytes_moved = ts->bytes_moved;
    rec.bytes_total = ts->bytes_total;
    rec.bytes_in_place = ts->bytes_in_place;
    if (ts->presized) {
      rec.presize_poolable_bytes = ts->presize_poolable_bytes;
      rec.presize_pooled_bytes = ts->presize_pooled_bytes;
      rec.presize_seconds = ts->presize_seconds;
      if (!ts->presize_error.empty())
        Notify("pre-sizing " + next.ToString() +
               " ahead failed (the transform allocated): " + ts->presize_error);
    }
    last_cross_host_ = {ts->bytes_cross_host, ts->cross_host_lower_bound};
    return Status::Ok();
  }

  const RunOptions& o_;
  const std::vector<ScheduleEntry>& entries_;
  const Model& model_;
  StateBackend& st_;
  RunSummary summary_;
  RunRecorder recorder_;
  std::optional<WarmPool> pool_;  // declared before env_, which points to it
  SegmentEnv env_;
  std::string model_text_;  // ModelToJson(model_)
  uint64_t log_offset_ = 0;
  std::optional<uint64_t> committed_;
  int64_t step_ = 0, samples_ = 0;
  std::set<std::size_t> kills_done_;
  std::size_t i_ = 0;
  int segment_ = 0;
  ParallelConfig cfg_;
  std::map<int, double> slowdown_;  // the schedule's, from its last entry that gave one
  // --rebalance: where the segment's log lines start, its launch, the pending decision.
  uint64_t seg_log_offset_ = 0;
  Clock::time_point t_segment_;
  std::optional<ConfigRebalance> rebalance_;
  // The splits measured (and left) in schedule entry history_entry_, for the speed model.
  std::vector<SplitSample> history_;
  std::size_t history_entry_ = SIZE_MAX;
  double last_transform_s_ = 0;
  // --warm: the reconfiguration's transform, run by the next segment once its workers
  // have their arguments (they re-join the new world while it runs).
  struct DeferredTransform {
    ParallelConfig to;
    ReconfigureRecord rec;
    Clock::time_point t_begin;
    std::optional<ConfigRebalance> rebalance;  // the decision, when it is a rebalance
  };
  std::optional<DeferredTransform> deferred_;
  std::array<int64_t, 2> last_cross_host_{};  // the last transform's fetched bytes, bound
  bool warned_ = false;
  int64_t skipped_logged_ = -1;
};

}  // namespace

Result<RunSummary> RunSchedule(const RunOptions& o, const RunInputs& in, StateBackend& st,
                               ProcessLauncher& launcher) {
  return ScheduleLoop(o, in, st, launcher).Run();
}

}  // namespace tenplex::runtime
