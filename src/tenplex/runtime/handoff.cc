#include "tenplex/runtime/handoff.h"

#include "tenplex/geometry/dtype.h"
#include "tenplex/util/file.h"

namespace tenplex::runtime {

using nlohmann::json;

SegmentFiles::SegmentFiles(const std::string& work_dir, int segment)
    : out_json(work_dir + "/state-out-" + std::to_string(segment) + ".json"),
      in_json(work_dir + "/state-in-" + std::to_string(segment) + ".json"),
      commit_prefix(work_dir + "/commit-seg" + std::to_string(segment) + "-step"),
      work_(work_dir),
      seg_(std::to_string(segment)) {}

std::string SegmentFiles::WorkerLog(int rank) const {
  return work_ + "/worker-seg" + seg_ + "-rank" + std::to_string(rank) + ".log";
}

std::vector<Target> SegmentTargets(const SegmentFiles& files, int64_t start, int64_t end,
                                   int64_t commit_every) {
  std::vector<Target> targets;
  if (commit_every > 0) {
    for (int64_t s = start + commit_every; s < end; s += commit_every) {
      targets.push_back({s, files.commit_prefix + std::to_string(s) + ".json"});
    }
  }
  targets.push_back({end, files.out_json});
  return targets;
}

Result<json> HandoffJson(StateBackend& st, const std::string& job, uint64_t v, const Layout& layout,
                         const io::StateInfo& info) {
  TP_ASSIGN_OR_RETURN(auto files, st.Files(job, v, layout));
  json j = info.AsJson();
  json ranks = json::array();
  for (const RankLayout& r : layout.ranks) {
    json ts = json::array();
    for (const LocalTensor& t : *r.tensors) {
      auto it = files[r.rank].find(t.name);
      if (it == files[r.rank].end() || it->second.empty()) {
        return DataLoss("version " + std::to_string(v) + " of job " + job +
                        " has no shared-memory file for rank " + std::to_string(r.rank) +
                        " tensor " + t.name);
      }
      ts.push_back({{"name", t.name},
                    {"dtype", std::string(DTypeName(t.dtype))},
                    {"shape", t.shape},
                    {"file", it->second}});
    }
    ranks.push_back({{"rank", r.rank}, {"tensors", std::move(ts)}});
  }
  j["ranks"] = std::move(ranks);
  return j;
}

Result<WorkerResult> ReadWorkerResult(const Target& t) {
  TP_ASSIGN_OR_RETURN(std::string text, ReadFile(t.path + ".result"));
  json res = json::parse(text, nullptr, false);
  if (res.is_discarded() || !res.is_object() || !res.contains("step") ||
      !res["step"].is_number_integer() || !res.contains("samples_consumed") ||
      !res["samples_consumed"].is_number_integer()) {
    return DataLoss(t.path + ".result is not {\"step\", \"samples_consumed\"}");
  }
  if (res["step"].get<int64_t>() != t.step) {
    return DataLoss("workers wrote their state at step " +
                    std::to_string(res["step"].get<int64_t>()) + " into " + t.path +
                    ", which is for step " + std::to_string(t.step));
  }
  return WorkerResult{t.step, res["samples_consumed"].get<int64_t>()};
}

std::vector<std::string> WorkerArgv(const std::vector<std::string>& command, const WorkerArgs& a,
                                    int rank) {
  std::vector<std::string> argv = command;
  for (const std::string& s :
       {std::string("--config"), a.config, std::string("--world-rank"), std::to_string(rank),
        std::string("--world-size"), std::to_string(a.world_size), std::string("--master-port"),
        std::to_string(a.port), std::string("--start-step"), std::to_string(a.start_step),
        std::string("--steps"), std::to_string(a.steps), std::string("--log"), a.log,
        std::string("--state-out"), a.state_out}) {
    argv.push_back(s);
  }
  if (a.commit_every > 0) {
    for (const std::string& s : {std::string("--commit-every"), std::to_string(a.commit_every),
                                 std::string("--commit-prefix"), a.commit_prefix}) {
      argv.push_back(s);
    }
  }
  if (a.state_in) {
    argv.push_back("--state-in");
    argv.push_back(*a.state_in);
  }
  if (!a.slowdown.empty()) {
    argv.push_back("--slowdown");
    argv.push_back(a.slowdown);
  }
  if (!a.warm_control.empty()) {
    argv.push_back("--warm-control");
    argv.push_back(a.warm_control);
  }
  argv.insert(argv.end(), a.extra.begin(), a.extra.end());
  return argv;
}

}  // namespace tenplex::runtime
