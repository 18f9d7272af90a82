#include "tenplex/util/log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tenplex/util/format.h"

namespace tenplex {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};

void VLog(LogLevel at, const char* format, va_list ap) {
  if (g_level.load() < static_cast<int>(at)) return;
  char buf[2048];
  std::vsnprintf(buf, sizeof(buf), format, ap);
  std::fprintf(stderr, "tenplex: %s\n", buf);
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr int64_t kRedrawNs = 200'000'000;

std::atomic<Progress*> g_current{nullptr};

}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

void LogInfo(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  VLog(LogLevel::kInfo, format, ap);
  va_end(ap);
}

void LogVerbose(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  VLog(LogLevel::kVerbose, format, ap);
  va_end(ap);
}

bool ProgressEnabled() {
  if (GetLogLevel() == LogLevel::kQuiet) return false;
  if (const char* force = std::getenv("TENPLEX_PROGRESS")) return std::strcmp(force, "1") == 0;
  return isatty(STDERR_FILENO) == 1;
}

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)),
      total_(total),
      enabled_(ProgressEnabled()),
      start_(std::chrono::steady_clock::now()) {
  next_draw_ns_ = NowNs() + kRedrawNs;
  previous_ = g_current.exchange(this);
}

Progress::~Progress() {
  g_current = previous_;
  Done();
}

void ReportProgress(uint64_t bytes) {
  if (Progress* p = g_current.load()) p->Add(bytes);
}

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_) return;
  int64_t now = NowNs(), next = next_draw_ns_.load();
  if (now < next || !next_draw_ns_.compare_exchange_strong(next, now + kRedrawNs)) return;
  Draw(false);
}

void Progress::Done() {
  if (!enabled_) return;
  Draw(true);
}

void Progress::Draw(bool final) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const uint64_t d = done_.load();
  std::string line = label_ + "  " + HumanBytes(static_cast<int64_t>(d));
  if (total_ > 0) {
    line += " / " + HumanBytes(static_cast<int64_t>(total_));
    char pct[32];
    std::snprintf(pct, sizeof(pct), " (%3.0f%%)",
                  100.0 * static_cast<double>(d) / static_cast<double>(total_));
    line += pct;
  }
  char rate[64];
  std::snprintf(rate, sizeof(rate), "  %.1f MB/s  %.1f s",
                s > 0 ? static_cast<double>(d) / s / 1e6 : 0.0, s);
  line += rate;
  std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  std::fflush(stderr);
  if (final) finished_ = true;
}

}  // namespace tenplex
