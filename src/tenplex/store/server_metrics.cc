// GET /metrics (Prometheus text format 0.0.4) and the access log of the HTTP server.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "tenplex/store/server_internal.h"

namespace tenplex::store {

namespace {

ConnectionLimits LimitsFor(const ServerOptions& o) {
  ConnectionLimits l;
  l.per_client = std::max<std::size_t>(1, o.max_connections_per_client);
  l.header_timeout = std::chrono::milliseconds(std::max(1, o.header_timeout_ms));
  return l;
}

void Metric(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

std::string Num(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.17g", v);
  return b;
}

}  // namespace

Server::Impl::Impl(Store& s, ServerOptions o)
    : store(s),
      options(std::move(o)),
      http(
          LimitsFor(options), [this](const RequestRecord& r) { OnRequest(r); },
          [this](const std::string& remote) {
            RequestRecord r;
            r.remote = remote;
            r.method = "-";
            r.target = "-";
            r.status = 503;
            std::lock_guard<std::mutex> l(metrics_mu);
            ++refused_connections;
            ++requests_by_status[503];
            if (access_log) {
              std::fprintf(access_log,
                           "connection closed unserved: %s sent no whole request in time, or it "
                           "was the oldest waiting one\n",
                           remote.c_str());
              std::fflush(access_log);
            }
          }) {
  if (options.access_log == "-") {
    access_log = stderr;
  } else if (!options.access_log.empty()) {
    access_log = std::fopen(options.access_log.c_str(), "ae");
    own_access_log = access_log != nullptr;
  }
}

Server::Impl::~Impl() {
  if (own_access_log) std::fclose(access_log);
}

void Server::Impl::OnRequest(const RequestRecord& r) {
  std::lock_guard<std::mutex> l(metrics_mu);
  ++requests_by_status[r.status];
  bytes_in += r.bytes_in;
  bytes_out += r.bytes_out;
  request_seconds += r.seconds;
  if (!access_log) return;
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char when[32];
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
  std::fprintf(access_log, "%s.%03dZ %s %s %s %d %llu %llu %.6f\n", when, ms, r.remote.c_str(),
               r.method.c_str(), r.target.c_str(), r.status,
               static_cast<unsigned long long>(r.bytes_in),
               static_cast<unsigned long long>(r.bytes_out), r.seconds);
  std::fflush(access_log);
}

std::string Server::Impl::Metrics() {
  std::string out;
  Metric(out, "tenplex_store_used_bytes", "gauge",
         "Bytes of tensors held (open, committed and kept versions).");
  out += "tenplex_store_used_bytes " + std::to_string(store.used_bytes()) + "\n";
  Metric(out, "tenplex_store_memory_limit_bytes", "gauge",
         "The store's memory limit (--memory-limit).");
  out += "tenplex_store_memory_limit_bytes " + std::to_string(store.memory_limit()) + "\n";
  Metric(out, "tenplex_store_pool_bytes", "gauge",
         "Bytes of released tensor files kept for recycling (the page pool).");
  out += "tenplex_store_pool_bytes " + std::to_string(store.pool_bytes()) + "\n";
  Metric(out, "tenplex_store_pool_clean_reused_bytes", "counter",
         "Bytes of pre-sized pool files new tensors took without zeroing them again.");
  out += "tenplex_store_pool_clean_reused_bytes " +
         std::to_string(store.pool_clean_reused_bytes()) + "\n";
  uint64_t jobs = 0, open = 0, committed = 0, tensors = 0;
  for (const std::string& name : store.Jobs()) {
    auto j = store.Job(name);
    if (!j.ok()) continue;  // deleted meanwhile
    ++jobs;
    for (const VersionInfo& v : j->versions) {
      (v.committed ? committed : open) += 1;
      tensors += v.tensors;
    }
  }
  Metric(out, "tenplex_store_jobs", "gauge", "Jobs in the store.");
  out += "tenplex_store_jobs " + std::to_string(jobs) + "\n";
  Metric(out, "tenplex_store_versions", "gauge", "Versions by state.");
  out += "tenplex_store_versions{state=\"open\"} " + std::to_string(open) + "\n";
  out += "tenplex_store_versions{state=\"committed\"} " + std::to_string(committed) + "\n";
  Metric(out, "tenplex_store_tensors", "gauge", "Tensors in all versions.");
  out += "tenplex_store_tensors " + std::to_string(tensors) + "\n";
  {
    std::lock_guard<std::mutex> l(metrics_mu);
    Metric(out, "tenplex_http_requests_total", "counter", "HTTP requests answered, by status.");
    for (const auto& [status, n] : requests_by_status) {
      out += "tenplex_http_requests_total{code=\"" + std::to_string(status) + "\"} " +
             std::to_string(n) + "\n";
    }
    Metric(out, "tenplex_http_bytes_total", "counter",
           "Bytes of HTTP requests and replies on the sockets.");
    out += "tenplex_http_bytes_total{direction=\"in\"} " + std::to_string(bytes_in) + "\n";
    out += "tenplex_http_bytes_total{direction=\"out\"} " + std::to_string(bytes_out) + "\n";
    Metric(out, "tenplex_http_request_seconds_total", "counter",
           "Seconds spent serving HTTP requests.");
    out += "tenplex_http_request_seconds_total " + Num(request_seconds) + "\n";
    Metric(out, "tenplex_http_connections_refused_total", "counter",
           "Connections closed before a whole first request arrived (past the deadline, or evicted "
           "for newer ones).");
    out += "tenplex_http_connections_refused_total " + std::to_string(refused_connections) + "\n";
  }
  Metric(out, "tenplex_http_connections_open", "gauge", "Open HTTP connections.");
  out += "tenplex_http_connections_open " + std::to_string(http.open_connections()) + "\n";
  for (const auto& source : metrics_sources) out += source();
  return out;
}

}  // namespace tenplex::store
