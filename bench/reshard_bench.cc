// End-to-end offline reshard against memcpy of the same bytes, measured in the same run
// (not part of the test suite; run by hand: build-X/bin/reshard_bench [DIR] [MODEL]
// [FROM] [TO]). Default: gpt3-350m with fp32 Adam (about 4.6 GiB) from tp=2,pp=2 to
// tp=4, files under /dev/shm (page cache, no disk).
//
// Reshard time covers everything `tenplex reshard` does: reading tenplex.json, mapping
// and validating every input file, hashing them against the recorded checksums (and
// once without that), planning, creating and filling the output files through mmap,
// syncing, hashing the outputs for the new tenplex.json and committing.
//
// The limit: memcpy of the same tensor bytes from the mapped input files into freshly
// created files of the same sizes in the same directory (so it pays the same page-cache
// mappings and fresh pages, populated ahead as reshard does, see transform/pages.h), split
// across the same thread pool. A hot memcpy between
// two pre-faulted 256 MiB buffers is printed for context. ratio = reshard GB/s (bytes
// written) / memcpy GB/s (bytes copied), goal >= 0.5. Peak extra space: two copies of the
// checkpoint; all files are removed at the end.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tenplex/io/checkpoint.h"
#include "tenplex/model/model.h"
#include "tenplex/transform/pages.h"
#include "tenplex/transform/reshard.h"
#include "tenplex/util/format.h"
#include "tenplex/util/thread_pool.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void Die(const tenplex::Status& s) {
  std::fprintf(stderr, "reshard_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

void ParallelMemcpy(tenplex::ThreadPool& pool, char* dst, const char* src, std::size_t n) {
  const std::size_t chunk = 8 << 20, chunks = (n + chunk - 1) / chunk;
  pool.ParallelFor(chunks, [&](std::size_t c) {
    const std::size_t b = c * chunk, e = std::min(n, b + chunk);
    std::memcpy(dst + b, src + b, e - b);
  });
}

// Copies the tensor bytes of every rank file of `in` into new files in `scratch`.
double MemcpyFiles(tenplex::ThreadPool& pool, const std::string& in, const std::string& scratch,
                   int64_t* bytes) {
  fs::create_directories(scratch);
  *bytes = 0;
  const auto t0 = Clock::now();
  for (const auto& entry : fs::directory_iterator(in)) {
    if (entry.path().extension() != ".safetensors") continue;
    auto f = tenplex::io::SafetensorsFile::Open(entry.path().string());
    if (!f.ok()) Die(f.status());
    const auto& ts = f->tensors();
    const std::size_t n = ts.empty() ? 0 : ts.back().end;
    const std::string out = scratch + "/" + entry.path().filename().string();
    int fd = ::open(out.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(n)) != 0)
      Die(tenplex::ErrnoError("create " + out, errno));
    void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) Die(tenplex::ErrnoError("mmap " + out, errno));
    const char* src = reinterpret_cast<const char*>(f->data(ts.front()));
    tenplex::transform::Populate(src, n, false, &pool);
    tenplex::transform::Populate(p, n, true, &pool);
    ParallelMemcpy(pool, static_cast<char*>(p), src, n);
    ::munmap(p, n);
    ::close(fd);
    *bytes += static_cast<int64_t>(n);
  }
  const double s = Seconds(t0);
  fs::remove_all(scratch);
  return s;
}

double HotMemcpyGBps(tenplex::ThreadPool& pool) {
  const std::size_t n = 256 << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    ParallelMemcpy(pool, b.data(), a.data(), n);
    best = std::min(best, Seconds(t0));
  }
  return static_cast<double>(n) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir =
      argc > 1 ? argv[1] : "/dev/shm/tenplex-reshard-bench-" + std::to_string(::getpid());
  const std::string model_name = argc > 2 ? argv[2] : "gpt3-350m";
  const std::string from_text = argc > 3 ? argv[3] : "tp=2,pp=2";
  const std::string to_text = argc > 4 ? argv[4] : "tp=4";
  if (fs::exists(dir)) {
    std::fprintf(stderr, "reshard_bench: %s exists; give a fresh directory\n", dir.c_str());
    return 1;
  }
  auto model = tenplex::LoadModel(model_name);
  if (!model.ok()) Die(model.status());
  auto from = tenplex::ParseConfig(from_text);
  auto to = tenplex::ParseConfig(to_text);
  if (!from.ok()) Die(from.status());
  if (!to.ok()) Die(to.status());
  tenplex::ThreadPool& pool = tenplex::ThreadPool::Default();
  const std::string a = dir + "/A", b = dir + "/B";
  fs::create_directories(dir);
  struct Cleanup {
    std::string d;
    ~Cleanup() { fs::remove_all(d); }
  } cleanup{dir};

  auto t0 = Clock::now();
  if (auto s = tenplex::transform::InitCheckpoint(*model, *from, a, 1, &pool); !s.ok()) Die(s);
  std::printf("model %s, %s -> %s, %d threads, files in %s\n", model_name.c_str(),
              from->ToString().c_str(), to->ToString().c_str(), static_cast<int>(pool.size()) + 1,
              dir.c_str());
  std::printf("ckpt init: %.2f s\n", Seconds(t0));

  int64_t bytes = 0;
  double memcpy_s = 1e9;
  const double hot = HotMemcpyGBps(pool);

  // Interleaved rounds, best of each: load from others on the machine hits both alike.
  double best[2] = {1e9, 1e9};
  tenplex::transform::ReshardReport report;
  for (int i = 0; i < 3; ++i) {
    memcpy_s = std::min(memcpy_s, MemcpyFiles(pool, a, dir + "/memcpy", &bytes));
    for (int verify = 0; verify < 2; ++verify) {
      tenplex::transform::ReshardOptions o;
      o.in = a;
      o.out = b;
      o.to = *to;
      o.verify_checksums = verify == 1;
      o.pool = &pool;
      auto r = tenplex::transform::Reshard(o);
      if (!r.ok()) Die(r.status());
      report = *r;
      best[verify] = std::min(best[verify], r->total_seconds);
      if (i == 0 && verify == 1) {
        if (auto s = tenplex::transform::VerifyCheckpoint(b, std::nullopt, &pool); !s.ok()) Die(s);
      }
      fs::remove_all(b);
    }
  }
  // Per byte: reshard writes each output byte once (the tied output embedding of the
  // old last stage is not needed twice), memcpy copies every input byte.
  const double in_gb = static_cast<double>(bytes) / 1e9;
  const double out_gb = static_cast<double>(report.bytes_written) / 1e9;
  const double limit = in_gb / memcpy_s;
  std::printf("tensor bytes: %s in, %s out (plan: %lld ops, plan time %.3f s)\n",
              tenplex::HumanBytes(bytes).c_str(), tenplex::HumanBytes(report.bytes_written).c_str(),
              static_cast<long long>(report.stats.ops), report.plan_seconds);
  std::printf("memcpy into fresh files (limit): %6.3f s  %.2f GB/s   (hot memcpy %.2f GB/s)\n",
              memcpy_s, limit, hot);
  std::printf("reshard, checksums verified:     %6.3f s  %.2f GB/s   ratio %.2f (goal >= 0.5)\n",
              best[1], out_gb / best[1], out_gb / best[1] / limit);
  std::printf("reshard, --no-verify:            %6.3f s  %.2f GB/s   ratio %.2f (goal >= 0.5)\n",
              best[0], out_gb / best[0], out_gb / best[0] / limit);
  std::printf("output verified element by element against the synthetic content\n");
  return 0;
}
