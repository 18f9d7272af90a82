// Log levels of the command line and progress lines on a terminal.
//
// One process-wide level: kQuiet (errors only), kInfo (the default: notes on stderr),
// kVerbose (what was decided and why). `tenplex -q|-v` sets it. Errors are not logged
// here: they travel as Status to one place that prints them (cli/command.cc).
//
// A Progress line ("label  1.2 GiB / 3.4 GiB  820 MB/s") is redrawn in place on stderr
// at most 5 times a second, and only when stderr is a terminal and the level is not
// kQuiet; otherwise it prints nothing, so logs and pipes stay clean. Add() is
// thread-safe (an atomic counter; the thread that crosses the redraw time draws).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace tenplex {

enum class LogLevel { kQuiet = 0, kInfo = 1, kVerbose = 2 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

// printf-style lines on stderr, prefixed "tenplex: ", when the level allows.
void LogInfo(const char* format, ...) __attribute__((format(printf, 1, 2)));
void LogVerbose(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Whether progress lines are drawn (stderr is a TTY, level >= kInfo; TENPLEX_PROGRESS=1
// forces them on, =0 off, for tests).
bool ProgressEnabled();

// Adds bytes to the progress line a command shows (the newest live Progress), or does
// nothing when there is none: libraries report their work with one call and need not
// know whether anyone is watching.
void ReportProgress(uint64_t bytes);

class Progress {
 public:
  // total 0: unknown (no "/ total"). While it lives, ReportProgress adds to it.
  Progress(std::string label, uint64_t total = 0);
  ~Progress();  // Done()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Add(uint64_t bytes);
  // Draws the final state and ends the line (once).
  void Done();

 private:
  void Draw(bool final);
  std::string label_;
  uint64_t total_;
  bool enabled_;
  std::atomic<uint64_t> done_{0};
  std::atomic<int64_t> next_draw_ns_{0};
  std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  bool finished_ = false;
  Progress* previous_ = nullptr;
};

}  // namespace tenplex
