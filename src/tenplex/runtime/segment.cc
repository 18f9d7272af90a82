#include "tenplex/runtime/segment.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include "tenplex/util/file.h"
#include "tenplex/util/log.h"

namespace tenplex::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

Segment::Segment(SegmentEnv env, SegmentSpec spec)
    : env_(env),
      spec_(std::move(spec)),
      files_(env_.backend->work_dir(), spec_.index),
      committed_(spec_.committed),
      step_(spec_.start),
      samples_(spec_.samples_consumed),
      to_kill_(spec_.kill_ranks),
      last_step_seen_(spec_.start - 1) {}

Status Segment::Run() {
  Status s = Open();
  if (s.ok()) s = Launch();
  if (s.ok() && spec_.transform_in) s = TransformIn();
  if (s.ok() && committed_) StateReady();
  if (s.ok()) s = Watch();
  if (s.ok()) s = Finish();
  if (!s.ok() && state_ != State::kFailed) return Fail(s);
  return s;
}

// Durable without a pool (as ever); with one (--warm) published without the fsyncs: they
// are messages to live workers, on the reconfiguration's path.
Status Segment::WriteHandoff(const std::string& path, const json& h) {
  return env_.pool ? PublishFile(path, h.dump()) : WriteFileAtomic(path, h.dump());
}

Status Segment::OpenTarget() {
  io::StateInfo info = spec_.info;
  info.set_step(targets_[target_].step);
  TP_ASSIGN_OR_RETURN(uint64_t v,
                      env_.backend->BeginLayout(env_.options->job, *spec_.layout, info));
  open_ = v;
  TP_ASSIGN_OR_RETURN(json h,
                      HandoffJson(*env_.backend, env_.options->job, v, *spec_.layout, info));
  return WriteHandoff(targets_[target_].path, h);
}

Status Segment::Open() {
  // Where the workers write their state, in order: the periodic commits inside the
  // segment (--commit-every), then its end. Each is a version of its own, opened when
  // the one before is committed (versions are committed in the order they are begun).
  targets_ = SegmentTargets(files_, spec_.start, spec_.end, spec_.commit_every);
  std::error_code ec;
  for (const Target& t : targets_) {
    fs::remove(t.path, ec);
    fs::remove(t.path + ".result", ec);
  }
  if (spec_.transform_in) {
    fs::remove(files_.in_json, ec);  // the workers wait for it
    return Status::Ok();             // TransformIn writes it and opens the first target
  }
  TP_RETURN_IF_ERROR(OpenTarget());
  if (committed_) {
    TP_ASSIGN_OR_RETURN(json in, HandoffJson(*env_.backend, env_.options->job, *committed_,
                                             *spec_.layout, spec_.info));
    TP_RETURN_IF_ERROR(WriteHandoff(files_.in_json, in));
  }
  return Status::Ok();
}

Status Segment::Launch() {
  const RunOptions& o = *env_.options;
  const ParallelConfig& cfg = spec_.layout->config;
  TP_ASSIGN_OR_RETURN(int port, FreePort());
  tail_.emplace(o.log_path);
  WorkerArgs args;
  args.config = cfg.ToString();
  args.world_size = cfg.world_size();
  args.port = port;
  args.start_step = spec_.start;
  args.steps = spec_.end - spec_.start;
  args.log = o.log_path;
  args.state_out = files_.out_json;
  args.commit_every = spec_.commit_every;
  args.slowdown = spec_.slowdown;
  args.extra = spec_.worker_args;
  args.commit_prefix = files_.commit_prefix;
  if (committed_ || spec_.transform_in) args.state_in = files_.in_json;
  t_launch_ = Clock::now();
  for (int r = 0; r < cfg.world_size(); ++r) TP_RETURN_IF_ERROR(StartWorker(r, args));
  if (env_.pool) env_.pool->Release(false);  // parked workers the new world has no rank for
  // A lost host takes its workers with it.
  TP_ASSIGN_OR_RETURN(std::vector<int> on_hosts,
                      env_.backend->RanksOnHosts(spec_.kill_hosts, cfg.world_size()));
  to_kill_.insert(to_kill_.end(), on_hosts.begin(), on_hosts.end());
  std::sort(to_kill_.begin(), to_kill_.end());
  to_kill_.erase(std::unique(to_kill_.begin(), to_kill_.end()), to_kill_.end());
  kill_scheduled_ = !to_kill_.empty() || !spec_.kill_hosts.empty();
  if (env_.pool && spec_.next_world > 0) {
    // Workers the next world adds start now, while this one trains (Python and torch
    // start-up off the reconfiguration's path).
    const int survivors = cfg.world_size() - static_cast<int>(to_kill_.size());
    TP_RETURN_IF_ERROR(
        env_.pool->StartSpares(spec_.next_world - survivors, o.command, env_.backend->work_dir()));
  }
  t_progress_ = t_last_step_ = t_kill_ = Clock::now();
  state_ = State::kRunning;
  return Status::Ok();
}

Status Segment::TransformIn() {
  TP_ASSIGN_OR_RETURN(uint64_t v, spec_.transform_in());
  committed_ = v;
  TP_ASSIGN_OR_RETURN(json in, HandoffJson(*env_.backend, env_.options->job, *committed_,
                                           *spec_.layout, spec_.info));
  TP_RETURN_IF_ERROR(WriteHandoff(files_.in_json, in));
  return OpenTarget();
}

void Segment::StateReady() {
  if (state_ready_ || !spec_.on_state) return;
  state_ready_ = true;
  spec_.on_state();
}

// Rank r: a parked warm worker when the pool has one (told its new arguments), else
// a new process.
Status Segment::StartWorker(int r, WorkerArgs& args) {
  const std::string log = files_.WorkerLog(r);
  WarmPool* pool = env_.pool;
  if (pool) {
    if (std::optional<WarmWorker> w = pool->Take()) {
      args.warm_control = w->prefix;
      workers_.push_back({w->pid, r, w->log, false, 0, *w, false});
      ++alive_;
      return pool->Send(workers_.back().warm, WorkerArgv({}, args, r));
    }
  }
  WarmWorker w;
  if (pool) {
    w = pool->NewWorker();
    args.warm_control = w.prefix;
  }
  TP_ASSIGN_OR_RETURN(pid_t pid,
                      env_.launcher->Spawn(WorkerArgv(env_.options->command, args, r), log));
  w.pid = pid;
  w.log = log;
  workers_.push_back({pid, r, log, false, 0, w, false});
  ++alive_;
  return Status::Ok();
}

Status Segment::Watch() {
  const RunOptions& o = *env_.options;
  while (alive_ > 0) {
    TP_RETURN_IF_ERROR(ReadLog());
    TP_RETURN_IF_ERROR(CommitIfWritten());
    TP_RETURN_IF_ERROR(KillIfDue());
    Reap();
    ParkIfDone();
    ParkSurvivors();
    if (env_.pool) env_.pool->ReapLeaving();
    if (alive_ > 0 && InterruptSignal() != 0) {
      return Fail(Aborted(
          "interrupted by signal " + std::to_string(InterruptSignal()) +
          ": workers stopped; the store keeps the last committed version" +
          (committed_ ? " (" + std::to_string(*committed_) + ")" : std::string(" (none)"))));
    }
    if (alive_ > 0 && aborting_ && !unparked_killed_ &&
        Since(t_kill_) > std::min(30.0, o.hang_seconds)) {
      WarnNotParked();
      KillUnparked();  // survivors that do not park in time are stopped the cold way
    }
    if (alive_ > 0 && Since(t_progress_) > o.hang_seconds) {
      KillWorkers();
      failed_ = true;
      failure_ = "no progress for " + std::to_string(static_cast<int>(o.hang_seconds)) +
                 " s (workers killed)";
    }
    if (alive_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::Ok();
}

Status Segment::ReadLog() {
  for (const json& line : tail_->Poll()) {
    if (!line.contains("step") || line.contains("event") || !line["step"].is_number_integer())
      continue;
    int64_t s = line["step"].get<int64_t>();
    if (s > last_step_seen_ && last_step_seen_ >= spec_.start) step_interval_ = Since(t_last_step_);
    last_step_seen_ = std::max(last_step_seen_, s);
    t_progress_ = t_last_step_ = Clock::now();
    TP_RETURN_IF_ERROR(env_.recorder->OnStep(s, step_, t_launch_));
  }
  return Status::Ok();
}

// A periodic commit written by every worker: commit its version, open the next.
Status Segment::CommitIfWritten() {
  std::error_code ec;
  if (target_ + 1 >= targets_.size() || failed_ || stopped_ ||
      !fs::exists(targets_[target_].path + ".result", ec)) {
    return Status::Ok();
  }
  Result<WorkerResult> res = ReadWorkerResult(targets_[target_]);
  Status s = res.status();
  if (s.ok()) {
    io::StateInfo info = spec_.info;
    info.set_step(res->step);
    info.set_samples_consumed(res->samples_consumed);
    s = env_.backend->Commit(env_.options->job, *open_, info);
  }
  if (s.ok()) {
    committed_ = *open_;
    open_.reset();
    step_ = res->step;
    samples_ = res->samples_consumed;
    ++target_;
    s = OpenTarget();
  }
  if (!s.ok())
    return Fail(s.WithContext("periodic commit of segment " + spec_.layout->config.ToString()));
  t_progress_ = Clock::now();
  StateReady();
  if (spec_.stop_after_commit && !kill_scheduled_ && spec_.stop_after_commit(step_)) {
    stopped_ = true;
    t_stop_begin_ = t_kill_ = Clock::now();
    if (env_.pool) {
      AbortSurvivors(true);  // warm: they agree on a step boundary and park there
    } else {
      StopWorkers();
    }
  }
  return Status::Ok();
}

// The scheduled kill, during the step before the end: half a step after step end-2
// is done (or 200 ms in when the segment has a single step).
Status Segment::KillIfDue() {
  const int64_t end = spec_.end;
  if (kill_scheduled_ && !killed_ && !kill_at_ &&
      (last_step_seen_ >= end - 2 || end - 1 == spec_.start)) {
    kill_at_ =
        end - 1 == spec_.start
            ? Clock::now() + std::chrono::milliseconds(200)
            : t_last_step_ + std::chrono::microseconds(static_cast<int64_t>(step_interval_ * 5e5));
  }
  if (!kill_at_ || killed_ || Clock::now() < *kill_at_) return Status::Ok();
  for (int r : to_kill_) {
    if (r >= 0 && r < static_cast<int>(workers_.size()) && !workers_[r].exited)
      env_.launcher->Kill(workers_[r].pid);
  }
  Result<std::vector<std::string>> gone = env_.backend->KillHosts(spec_.kill_hosts);
  if (!gone.ok()) return Fail(gone.status());
  lost_hosts_ = *gone;
  killed_ = true;
  t_kill_ = Clock::now();
  return Status::Ok();
}

void Segment::Reap() {
  for (Worker& w : workers_) {
    if (w.exited || w.parked) continue;
    std::optional<int> status = env_.launcher->TryWait(w.pid);
    if (!status) continue;
    w.exited = true;
    w.status = *status;
    --alive_;
    t_progress_ = Clock::now();
    if (ExitedOk(*status) || failed_) continue;
    failed_ = true;
    if (!killed_ && !stopped_) {
      failure_ = "worker rank " + std::to_string(w.rank) + " " + DescribeExit(*status) +
                 "; its output (" + KeepLog(w.log) + ") ends with:\n" + FileTail(w.log);
    }
    if ((killed_ || stopped_) && env_.pool) {
      AbortSurvivors();  // they park, alive, for the next world
    } else {
      KillWorkers();  // the others cannot finish the step without it
    }
  }
}

// Warm: the segment's last version is written (rank 0 wrote its .result after every
// rank's state): the workers park instead of exiting.
void Segment::ParkIfDone() {
  std::error_code ec;
  // (A scheduled kill still strikes, and fails the segment as without --warm: the
  // survivors park after the abort.)
  if (!env_.pool || failed_ || stopped_ || kill_scheduled_ || alive_ == 0 ||
      target_ + 1 != targets_.size() || !fs::exists(files_.out_json + ".result", ec))
    return;
  for (Worker& w : workers_) {
    if (w.exited || w.parked) continue;
    w.parked = true;
    --alive_;
  }
}

void Segment::AbortSurvivors(bool planned) {
  if (aborting_) return;
  aborting_ = true;
  for (Worker& w : workers_) {
    if (!w.exited && !env_.pool->Abort(w.warm, planned).ok()) env_.launcher->Kill(w.pid);
  }
}

// Names the workers that did not park after an abort (they are killed and the next
// segment starts cold): their logs say where they were.
void Segment::WarnNotParked() const {
  for (const Worker& w : workers_) {
    if (w.exited || w.parked) continue;
    LogInfo(
        "run: warm worker rank %d (pid %d) did not park within %.0f s of the abort; "
        "stopping it (log %s)",
        w.rank, static_cast<int>(w.pid), Since(t_kill_), w.log.c_str());
  }
}

void Segment::ParkSurvivors() {
  if (!aborting_) return;
  for (Worker& w : workers_) {
    if (w.exited || w.parked || !WarmPool::IsParked(w.warm) ||
        std::count(to_kill_.begin(), to_kill_.end(), w.rank) > 0)
      continue;
    w.parked = true;
    --alive_;
  }
}

Status Segment::Finish() {
  const RunOptions& o = *env_.options;
  const std::string cfg = spec_.layout->config.ToString();
  if (stopped_) {  // (warm: every worker has parked or exited by now)
    env_.backend->Drop(o.job, *open_);
    open_.reset();
    stop_seconds_ = Since(t_stop_begin_);
    state_ = State::kStopped;
    HandToPool();
    return Status::Ok();
  }
  if (failed_ && !killed_) {
    return Fail(Internal("segment " + cfg + " from step " + std::to_string(spec_.start) +
                         " failed: " + failure_));
  }
  if (failed_) {
    env_.backend->Drop(o.job, *open_);
    open_.reset();
    t_stop_begin_ = t_kill_;
    stop_seconds_ = Since(t_kill_);
    state_ = State::kKilled;
    HandToPool();
    return env_.recorder->Failure({{"event", "failure"},
                                   {"config", cfg},
                                   {"killed_ranks", to_kill_},
                                   {"lost_hosts", lost_hosts_},
                                   {"during_step", spec_.end - 1},
                                   {"rerun_from", step_},
                                   {"segment_start", spec_.start}});
  }
  std::error_code ec;
  if (target_ + 1 != targets_.size()) {
    // The workers exited 0 without writing every periodic commit.
    return Fail(Internal("workers exited 0 but wrote no " + targets_[target_].path + ".result"));
  }
  if (!fs::exists(files_.out_json + ".result", ec)) {
    return Fail(Internal("workers exited 0 but rank 0 wrote no " + files_.out_json + ".result"));
  }
  Result<WorkerResult> res = ReadWorkerResult(targets_.back());
  if (!res.ok()) return Fail(Internal(res.status().message()));
  step_ = res->step;
  samples_ = res->samples_consumed;
  io::StateInfo info = spec_.info;
  info.set_step(step_);
  info.set_samples_consumed(samples_);
  TP_RETURN_IF_ERROR(env_.backend->Commit(o.job, *open_, info));
  committed_ = *open_;
  open_.reset();
  t_stop_begin_ = t_last_step_;
  stop_seconds_ = Since(t_last_step_);
  state_ = State::kCompleted;
  HandToPool();
  return Status::Ok();
}

// Warm: the parked workers (in rank order) wait in the pool for the next segment.
void Segment::HandToPool() {
  if (!env_.pool) return;
  std::vector<WarmWorker> parked;
  for (Worker& w : workers_) {
    if (!w.parked || w.exited) continue;
    parked.push_back(w.warm);
    w.exited = true;  // no longer this segment's
  }
  env_.pool->Park(std::move(parked));
}

Status Segment::Fail(Status s) {
  StopWorkers();
  if (open_) env_.backend->Drop(env_.options->job, *open_);
  open_.reset();
  state_ = State::kFailed;
  return s;
}

// The path of a (complete) worker log that outlives the run.
std::string Segment::KeepLog(const std::string& log) const {
  if (env_.kept_logs_dir.empty()) return log;
  std::error_code ec;
  fs::create_directories(env_.kept_logs_dir, ec);
  const std::string to = env_.kept_logs_dir + "/" + fs::path(log).filename().string();
  if (!ec) fs::copy_file(log, to, fs::copy_options::overwrite_existing, ec);
  if (ec) return log + ", removed at exit: copying it to " + to + " failed: " + ec.message();
  return to;
}

void Segment::KillWorkers() {
  for (Worker& x : workers_) {
    if (!x.exited) env_.launcher->Kill(x.pid);
  }
}

// The hang clock restarts here: the parked survivors must not be taken for hung while
// the killed ones die (a slow death under load once let the hang check kill them all).
void Segment::KillUnparked() {
  for (Worker& x : workers_) {
    if (!x.exited && !x.parked) env_.launcher->Kill(x.pid);
  }
  unparked_killed_ = true;
  t_progress_ = Clock::now();
}

void Segment::StopWorkers() {
  KillWorkers();
  for (Worker& x : workers_) {
    if (!x.exited) x.status = env_.launcher->Wait(x.pid);
    x.exited = true;
  }
  alive_ = 0;
}

}  // namespace tenplex::runtime
