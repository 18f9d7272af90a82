#include "tenplex/runtime/report.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "tenplex/util/file.h"
#include "tenplex/util/format.h"

namespace tenplex::runtime {

using nlohmann::json;

namespace {

// A reconfiguration as the log's "reconfigure" event and the --json summary show it.
json ReconfigureJson(const ReconfigureRecord& p) {
  return {{"step", p.step},
          {"from", p.from},
          {"to", p.to},
          {"seconds", p.seconds},
          {"stop_seconds", p.stop_seconds},
          {"transform_seconds", p.transform_seconds},
          {"restart_seconds", p.restart_seconds},
          {"bytes_moved", p.bytes_moved},
          {"bytes_total", p.bytes_total},
          {"bytes_in_place", p.bytes_in_place},
          {"after_failure", p.after_failure},
          {"killed_ranks", p.killed},
          {"lost_steps", p.lost_steps},
          {"presize_poolable_bytes", p.presize_poolable_bytes},
          {"presize_pooled_bytes", p.presize_pooled_bytes},
          {"presize_seconds", p.presize_seconds}};
}

}  // namespace

Status CreateLog(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open " + path, errno);
  ::close(fd);
  return Status::Ok();
}

Status AppendLogLine(const std::string& path, const json& j) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open " + path, errno);
  std::string line = j.dump() + "\n";
  ssize_t n = ::write(fd, line.data(), line.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(line.size())) return ErrnoError("append to " + path, err);
  return Status::Ok();
}

void RunRecorder::SetPending(const ReconfigureRecord& rec, Clock::time_point t_begin) {
  pending_ = rec;
  t_begin_ = t_begin;
  if (rec.after_failure) t_failure_ = t_begin;
}

Status RunRecorder::OnStep(int64_t s, int64_t start_step, Clock::time_point t_launch) {
  if (pending_ && s >= start_step) {
    ReconfigureRecord& p = *pending_;
    p.restart_seconds = Since(t_launch);
    p.seconds = Since(t_begin_);
    summary_->reconfigurations.push_back(p);
    json ev = ReconfigureJson(p);
    ev["event"] = "reconfigure";
    if (!p.after_failure) ev.erase("lost_steps");
    TP_RETURN_IF_ERROR(AppendLogLine(log_, ev));
    if (p.after_failure)
      recovering_ = static_cast<std::ptrdiff_t>(summary_->reconfigurations.size()) - 1;
    pending_.reset();
  }
  if (recovering_ >= 0 && s >= summary_->reconfigurations[recovering_].failed_step) {
    // Back where the failure struck: the lost steps are re-done.
    ReconfigureRecord& r = summary_->reconfigurations[recovering_];
    r.recovered_seconds = Since(t_failure_);
    TP_RETURN_IF_ERROR(AppendLogLine(log_, {{"event", "recovered"},
                                            {"step", r.failed_step},
                                            {"seconds", r.recovered_seconds},
                                            {"lost_steps", r.lost_steps}}));
    recovering_ = -1;
  }
  return Status::Ok();
}

Status RunRecorder::Failure(const json& event) { return AppendLogLine(log_, event); }

void RunRecorder::Finish() {
  if (pending_) {
    pending_->seconds = pending_->stop_seconds + pending_->transform_seconds;  // no step followed
    summary_->reconfigurations.push_back(*pending_);
  }
  pending_.reset();
}

Result<std::vector<StepRecord>> ReadStepLog(const std::string& path, uint64_t offset) {
  TP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::map<int64_t, StepRecord> steps;
  std::size_t start = std::min<std::size_t>(offset, text.size());
  std::size_t lineno =
      static_cast<std::size_t>(std::count(text.begin(), text.begin() + start, '\n'));
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++lineno;
    json j = json::parse(text.substr(start, end - start), nullptr, false);
    start = end + 1;
    if (j.is_discarded() || !j.is_object()) {
      return DataLoss(path + ": line " + std::to_string(lineno) + " is not a JSON object");
    }
    if (!j.contains("step") || j.contains("event")) continue;
    if (!j["step"].is_number_integer() || !j.contains("loss") || !j["loss"].is_number()) {
      return DataLoss(path + ": line " + std::to_string(lineno) +
                      " lacks an integer step or a loss");
    }
    StepRecord r;
    r.step = j["step"].get<int64_t>();
    r.loss = j["loss"].get<double>();
    if (j.contains("config") && j["config"].is_string()) r.config = j["config"].get<std::string>();
    if (j.contains("samples") && j["samples"].is_array()) {
      for (const json& s : j["samples"]) {
        if (s.is_number_integer()) r.samples.push_back(s.get<int64_t>());
      }
    }
    if (j.contains("seconds") && j["seconds"].is_number()) r.seconds = j["seconds"].get<double>();
    if (j.contains("rank_seconds") && j["rank_seconds"].is_array()) {
      for (const json& s : j["rank_seconds"])
        r.rank_seconds.push_back(s.is_number() ? s.get<double>() : 0.0);
    }
    steps[r.step] = std::move(r);
  }
  std::vector<StepRecord> out;
  for (auto& [k, v] : steps) out.push_back(std::move(v));
  return out;
}

Status CompareWithBaseline(RunSummary& summary, const std::string& baseline_log) {
  TP_ASSIGN_OR_RETURN(std::vector<StepRecord> base, ReadStepLog(baseline_log));
  std::map<int64_t, const StepRecord*> by_step;
  for (const StepRecord& b : base) by_step[b.step] = &b;
  double dev = 0;
  int64_t mismatches = 0;
  for (const StepRecord& s : summary.steps) {
    auto it = by_step.find(s.step);
    if (it == by_step.end()) {
      ++mismatches;
      continue;
    }
    dev = std::max(
        dev, std::abs(s.loss - it->second->loss) / std::max(1e-12, std::abs(it->second->loss)));
    if (s.samples != it->second->samples) ++mismatches;
  }
  summary.max_loss_deviation = dev;
  summary.sample_mismatches = mismatches;
  return Status::Ok();
}

std::string SummaryTable(const RunSummary& s) {
  std::string out;
  char line[512];
  if (s.resumed_version) {
    std::snprintf(line, sizeof(line), "continued from version %llu at step %lld\n",
                  static_cast<unsigned long long>(*s.resumed_version),
                  static_cast<long long>(s.resumed_step));
    out += line;
  }
  out += "step  config                     loss\n";
  std::string last_cfg;
  for (const StepRecord& r : s.steps) {
    std::snprintf(line, sizeof(line), "%4lld  %-24s %9.5f%s\n", static_cast<long long>(r.step),
                  r.config.c_str(), r.loss,
                  r.config != last_cfg && !last_cfg.empty() ? "   <- reconfigured" : "");
    out += line;
    last_cfg = r.config;
  }
  if (!s.reconfigurations.empty()) {
    out += "\nreconfigurations (seconds: stop + transform + restart to first step done)\n";
    out +=
        " step  from -> to                                         stop  transform  restart      "
        "moved      total  note\n";
    for (const ReconfigureRecord& r : s.reconfigurations) {
      std::string note = r.after_failure ? "after killing rank(s)" : "";
      for (std::size_t k = 0; k < r.killed.size(); ++k)
        note += (k ? "," : " ") + std::to_string(r.killed[k]);
      if (r.after_failure && r.recovered_seconds > 0) {
        char buf[160];
        std::snprintf(buf, sizeof(buf),
                      "; %lld lost step(s), step %lld done again %.2f s after the kill",
                      static_cast<long long>(r.lost_steps), static_cast<long long>(r.failed_step),
                      r.recovered_seconds);
        note += buf;
      }
      std::snprintf(line, sizeof(line), "%5lld  %-22s -> %-22s %6.2f %9.3f %8.2f %10s %10s  %s\n",
                    static_cast<long long>(r.step), r.from.c_str(), r.to.c_str(), r.stop_seconds,
                    r.transform_seconds, r.restart_seconds, HumanBytes(r.bytes_moved).c_str(),
                    HumanBytes(r.bytes_total).c_str(), note.c_str());
      out += line;
    }
  }
  if (s.max_loss_deviation) {
    std::snprintf(line, sizeof(line),
                  "\nlargest loss deviation from the static run: %.3g (relative); steps with other "
                  "samples: %lld\n",
                  *s.max_loss_deviation, static_cast<long long>(*s.sample_mismatches));
    out += line;
  }
  std::snprintf(line, sizeof(line), "total %.1f s\n", s.seconds);
  out += line;
  return out;
}

std::string SummaryJson(const RunSummary& s) {
  json steps = json::array(), reconfigurations = json::array();
  for (const StepRecord& r : s.steps)
    steps.push_back(
        {{"step", r.step}, {"loss", r.loss}, {"config", r.config}, {"samples", r.samples}});
  for (const ReconfigureRecord& r : s.reconfigurations) {
    json j = ReconfigureJson(r);
    if (r.after_failure) {
      j["failed_step"] = r.failed_step;
      j["recovered_seconds"] = r.recovered_seconds;
    }
    reconfigurations.push_back(std::move(j));
  }
  json j = {{"steps", std::move(steps)},      {"reconfigurations", std::move(reconfigurations)},
            {"seconds", s.seconds},           {"resumed_version", nullptr},
            {"resumed_step", s.resumed_step}, {"max_loss_deviation", nullptr},
            {"sample_mismatches", nullptr}};
  if (s.resumed_version) j["resumed_version"] = *s.resumed_version;
  if (s.max_loss_deviation) j["max_loss_deviation"] = *s.max_loss_deviation;
  if (s.sample_mismatches) j["sample_mismatches"] = *s.sample_mismatches;
  return j.dump();
}

}  // namespace tenplex::runtime
