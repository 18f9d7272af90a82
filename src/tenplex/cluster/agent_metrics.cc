#include "tenplex/cluster/agent_metrics.h"

#include <cstdio>

namespace tenplex::cluster {

void AgentMetrics::CountPrepare(bool ok, int64_t bytes_fetched, int64_t bytes_local,
                                int64_t bytes_linked, int64_t bytes_fetched_shm, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ok) {
    ++prepared_;
    bytes_fetched_ += bytes_fetched;
    bytes_local_ += bytes_local;
    bytes_linked_ += static_cast<uint64_t>(bytes_linked);
    bytes_fetched_shm_ += static_cast<uint64_t>(bytes_fetched_shm);
  } else {
    ++failed_;
  }
  prepare_seconds_ += seconds;
}

std::string AgentMetrics::Text(const transport::Transport& transport, uint64_t plans_reused,
                               const ServedMaps& maps) {
  std::lock_guard<std::mutex> lock(mu_);
  auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.17g", v);
    return std::string(b);
  };
  std::string o;
  o += "# HELP tenplex_transform_prepares_total Transform prepares of this host (phase one), by "
       "outcome.\n";
  o += "# TYPE tenplex_transform_prepares_total counter\n";
  o += "tenplex_transform_prepares_total{outcome=\"ok\"} " + std::to_string(prepared_) + "\n";
  o += "tenplex_transform_prepares_total{outcome=\"failed\"} " + std::to_string(failed_) + "\n";
  o += "# HELP tenplex_transform_bytes_total Bytes of new versions written by transforms, by "
       "source.\n";
  o += "# TYPE tenplex_transform_bytes_total counter\n";
  o += "tenplex_transform_bytes_total{source=\"fetched\"} " + std::to_string(bytes_fetched_) + "\n";
  o += "tenplex_transform_bytes_total{source=\"local\"} " + std::to_string(bytes_local_) + "\n";
  o += "tenplex_transform_bytes_total{source=\"linked\"} " + std::to_string(bytes_linked_) + "\n";
  o += "# HELP tenplex_transform_fetched_shm_bytes_total The part of the fetched bytes read "
       "from same-host peers' shared-memory files (not over the data plane).\n";
  o += "# TYPE tenplex_transform_fetched_shm_bytes_total counter\n";
  o += "tenplex_transform_fetched_shm_bytes_total " + std::to_string(bytes_fetched_shm_) + "\n";
  o += "# HELP tenplex_peer_files_located_total Tensor files named to same-host peers "
       "(POST /v1/transform/locate).\n";
  o += "# TYPE tenplex_peer_files_located_total counter\n";
  o += "tenplex_peer_files_located_total " + std::to_string(files_located_.load()) + "\n";
  o += "# HELP tenplex_transform_plans_reused_total Prepares and presizes that took the plan "
       "of the request before (the same transform pre-sized ahead), not planning again.\n";
  o += "# TYPE tenplex_transform_plans_reused_total counter\n";
  o += "tenplex_transform_plans_reused_total " + std::to_string(plans_reused) + "\n";
  o += "# HELP tenplex_transform_seconds_total Seconds spent in transform prepares.\n";
  o += "# TYPE tenplex_transform_seconds_total counter\n";
  o += "tenplex_transform_seconds_total " + num(prepare_seconds_) + "\n";
  o += "# HELP tenplex_fetch_served_bytes_total Bytes this daemon's data plane sent to peers.\n";
  o += "# TYPE tenplex_fetch_served_bytes_total counter\n";
  o += "tenplex_fetch_served_bytes_total " + std::to_string(transport.BytesServed()) + "\n";
  o += "# HELP tenplex_fetch_bounded_total Data-plane requests refused for their size or their "
       "connection's answers in flight.\n# TYPE tenplex_fetch_bounded_total counter\n"
       "tenplex_fetch_bounded_total " +
       std::to_string(transport.RequestsRefused()) +
       "\n# HELP tenplex_fetch_staged_bytes_peak The most staging memory answers held at once.\n"
       "# TYPE tenplex_fetch_staged_bytes_peak gauge\ntenplex_fetch_staged_bytes_peak " +
       std::to_string(transport.PeakStagedBytes()) + "\n";
  o += "# HELP tenplex_fetch_refused_total Data-plane fetches refused for their capability, by "
       "reason.\n";
  o += "# TYPE tenplex_fetch_refused_total counter\n";
  for (auto r : {transport::CapabilityRefusal::kMissing, transport::CapabilityRefusal::kWrong,
                 transport::CapabilityRefusal::kExpired, transport::CapabilityRefusal::kScope}) {
    o += "tenplex_fetch_refused_total{reason=\"" +
         std::string(transport::CapabilityRefusalName(r)) + "\"} " +
         std::to_string(refused_.Get(r) + transport.ProbeRefused(r)) + "\n";
  }
  o += "# HELP tenplex_served_maps_prefaulted_total Old tensors mapped and pre-faulted for "
       "peers' fetches: at the prepare (those the coordinator says peers read) or at a fetch "
       "that found no map.\n# TYPE tenplex_served_maps_prefaulted_total counter\n"
       "tenplex_served_maps_prefaulted_total{when=\"prepare\"} " +
       std::to_string(maps.prefaulted_ahead()) +
       "\ntenplex_served_maps_prefaulted_total{when=\"fetch\"} " +
       std::to_string(maps.prefaulted_on_fetch()) + "\n";
  return o;
}

}  // namespace tenplex::cluster
