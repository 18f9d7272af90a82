// Dataset state throughput, each figure beside a limit measured in the same run.
//
//   data_bench [--samples N (default 10000000)] [--mib M (default 128)] [--reps R (default 5)]
//
// Order generation: samples/s of Permutation::ForEpoch (SplitMix64 + Lemire +
// Fisher-Yates, the whole epoch's order) against two limits on the same array:
//   iota          writing 0..N-1 (a pass over the memory, no randomness: the ceiling
//                 for anything that produces N ids),
//   std::shuffle  libstdc++'s shuffle driven by std::mt19937_64 (a peer).
// Rank batches: samples/s of GlobalOrder::AppendBatch walking a rank's slices across
// two epochs (includes generating the second epoch's order).
// FUSE read: MB/s (1e6 bytes/s) of reading a rank's file from `tenplex data mount`'s
// file system (mounted in this process, sequential 1 MiB read() calls, the file
// opened anew each repetition so the kernel cache is dropped) against two limits:
//   plain    a plain file holding the same bytes (warm page cache, same reads): ratio
//            fuse / plain is what reading through the view costs against no view;
//   flat     the same bytes as one flat file served by the same FuseMount (one memcpy
//            per request from a mapped file): ratio fuse / flat is the view's own
//            cost within FUSE, i.e. how close it is to the transport's limit;
//   in-proc  (for reference) ViewFile::Read called directly, no kernel in between.
// Best of R.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tenplex/data/dataset.h"
#include "tenplex/data/fuse_mount.h"
#include "tenplex/data/order.h"
#include "tenplex/data/view.h"
#include "tenplex/util/file.h"

namespace td = tenplex::data;
namespace fs = std::filesystem;

namespace {

double Best(int reps, const std::function<void()>& op) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    op();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void Check(const tenplex::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "data_bench: %s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Reads a whole file with read() into a 1 MiB buffer; returns the bytes read.
uint64_t ReadWhole(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  static std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      std::perror("read");
      std::exit(1);
    }
    if (n == 0) break;
    total += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return total;
}

void OrderRows(uint64_t n, int reps) {
  std::vector<uint32_t> a(n);
  td::Permutation keep;
  const double fy = Best(reps, [&] { keep = td::Permutation::ForEpoch(n, 42, 0); });
  const double iota = Best(reps, [&] { std::iota(a.begin(), a.end(), 0u); });
  std::mt19937_64 rng(1);
  const double shuf = Best(reps, [&] {
    std::iota(a.begin(), a.end(), 0u);
    std::shuffle(a.begin(), a.end(), rng);
  });
  std::printf("%12llu  %14.3g  %14.3g  %6.3f  %14.3g  %6.2f\n", static_cast<unsigned long long>(n),
              n / fy, n / iota, iota / fy, n / shuf, shuf / fy);
}

// The FUSE transport's own limit: a tree with one file whose bytes are one mapped
// plain file (Read = one memcpy), served by the same FuseMount.
class FlatFile : public td::ViewFile {
 public:
  explicit FlatFile(tenplex::MappedFile m) : m_(std::move(m)) {}
  uint64_t size() const override { return m_.size(); }
  tenplex::Result<std::size_t> Read(uint64_t off, std::size_t len, char* out) const override {
    if (off >= m_.size()) return std::size_t{0};
    len = std::min<uint64_t>(len, m_.size() - off);
    std::memcpy(out, m_.data() + off, len);
    return len;
  }

 private:
  tenplex::MappedFile m_;
};

class FlatTree : public td::FileTree {
 public:
  explicit FlatTree(tenplex::MappedFile m) : f_(std::move(m)) {}
  const td::ViewFile* File(std::string_view p) const override {
    return p == "flat" ? &f_ : nullptr;
  }
  bool IsDir(std::string_view p) const override { return p.empty(); }
  std::vector<std::string> List(std::string_view p) const override {
    return p.empty() ? std::vector<std::string>{"flat"} : std::vector<std::string>{};
  }

 private:
  FlatFile f_;
};

struct Fixture {
  std::string dir;
  std::shared_ptr<const td::Dataset> dataset;
};

Fixture MakeJsonl(const std::string& dir, uint64_t bytes) {
  std::string src;
  src.reserve(bytes + 4096);
  std::mt19937_64 rng(3);
  for (uint64_t i = 0; src.size() < bytes; ++i) {
    src += "{\"id\": " + std::to_string(i) + ", \"text\": \"" +
           std::string(200 + rng() % 1800, 'a' + i % 26) + "\"}\n";
  }
  Check(tenplex::WriteFileAtomic(dir + "/d.jsonl", src), "write jsonl");
  Check(td::BuildIndex(dir + "/d.jsonl", td::DataFormat::kJsonl, dir + "/jidx"), "index jsonl");
  auto d = td::Dataset::Open(dir + "/jidx");
  Check(d.status(), "open jsonl");
  return {dir, *d};
}

Fixture MakeMegatron(const std::string& dir, uint64_t bytes) {
  // uint16 tokens, sequences of 512..2559 tokens, written back to back.
  std::string bin, lengths, pointers;
  std::mt19937_64 rng(4);
  uint64_t n = 0;
  while (bin.size() < bytes) {
    const int32_t len = 512 + static_cast<int32_t>(rng() % 2048);
    const int64_t ptr = static_cast<int64_t>(bin.size());
    pointers.append(reinterpret_cast<const char*>(&ptr), 8);
    lengths.append(reinterpret_cast<const char*>(&len), 4);
    for (int32_t k = 0; k < len; ++k) {
      uint16_t t = static_cast<uint16_t>(rng());
      bin.append(reinterpret_cast<const char*>(&t), 2);
    }
    ++n;
  }
  std::string idx = td::EncodeMegatronHeader(8, n, 2) + lengths + pointers;
  int64_t docs[2] = {0, static_cast<int64_t>(n)};
  idx.append(reinterpret_cast<const char*>(docs), 16);
  Check(tenplex::WriteFileAtomic(dir + "/m.bin", bin), "write bin");
  Check(tenplex::WriteFileAtomic(dir + "/m.idx", idx), "write idx");
  Check(td::BuildIndex(dir + "/m", td::DataFormat::kMegatron, dir + "/midx"), "index megatron");
  auto d = td::Dataset::Open(dir + "/midx");
  Check(d.status(), "open megatron");
  return {dir, *d};
}

void FuseRow(const Fixture& f, const char* name, const char* file, uint64_t dp, int reps) {
  static int counter = 0;
  const std::string tag = std::to_string(counter++);
  const std::string mp = f.dir + "/mnt-" + tag;
  fs::create_directories(mp);
  td::ViewSpec spec{7, 64, dp, 0, {}};
  auto view = td::DatasetView::Create(f.dataset, spec);
  Check(view.status(), "view");
  const std::string rel = td::DatasetView::RankDir(0) + "/" + file;
  auto bytes = td::ReadAll(*(*view)->File(rel));
  Check(bytes.status(), "materialise");
  const std::string plain = f.dir + "/plain-" + tag;
  Check(tenplex::WriteFileAtomic(plain, *bytes), "write plain");
  auto mount = td::FuseMount::Start(*view, mp);
  Check(mount.status(), "mount (needs /dev/fuse)");
  const uint64_t size = bytes->size();
  if (ReadWhole(mp + "/" + rel) != size || ReadWhole(plain) != size) {
    std::fprintf(stderr, "data_bench: size mismatch\n");
    std::exit(1);
  }
  const double t_plain = Best(reps, [&] { ReadWhole(plain); });
  // The view's own Read, in process, same 1 MiB pieces: what the daemon costs
  // without the kernel round trips.
  const td::ViewFile* vf = (*view)->File(rel);
  std::vector<char> buf(1 << 20);
  const double t_view = Best(reps, [&] {
    for (uint64_t off = 0; off < size; off += buf.size())
      Check(vf->Read(off, buf.size(), buf.data()).status(), "read");
  });
  const double t_fuse = Best(reps, [&] { ReadWhole(mp + "/" + rel); });
  (*mount)->Stop();
  // The same bytes through a flat FUSE file (mount of FlatTree).
  auto mapped = tenplex::MappedFile::Open(plain);
  Check(mapped.status(), "map plain");
  const std::string flat_mp = mp + "-flat";
  fs::create_directories(flat_mp);
  auto flat = td::FuseMount::Start(std::make_shared<FlatTree>(std::move(*mapped)), flat_mp);
  Check(flat.status(), "mount flat");
  const double t_flat = Best(reps, [&] { ReadWhole(flat_mp + "/flat"); });
  (*flat)->Stop();
  std::printf("%-26s %3llu %7.1f %8.0f %8.0f %6.3f %8.0f %6.3f %8.0f\n", name,
              static_cast<unsigned long long>(dp), size / 1e6, size / t_fuse / 1e6,
              size / t_plain / 1e6, t_plain / t_fuse, size / t_flat / 1e6, t_flat / t_fuse,
              size / t_view / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t samples = 10000000, mib = 128;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--samples")
      samples = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--mib")
      mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: data_bench [--samples N] [--mib M] [--reps R]\n");
      return 2;
    }
  }
  std::printf(
      "order generation (samples/s; ratio = limit time / our time, 1.0 = as fast as the limit)\n");
  std::printf("%12s  %14s  %14s  %6s  %14s  %6s\n", "samples", "fisher-yates", "iota (limit)",
              "ratio", "std::shuffle", "ratio");
  for (uint64_t n : {samples / 100, samples / 10, samples}) OrderRows(n, reps);

  {
    const uint64_t n = samples, b = 1024, dp = 8;
    auto o = td::GlobalOrder::Create({n, 42, b});
    Check(o.status(), "order");
    std::vector<uint64_t> ids;
    ids.reserve(2 * n / dp + b);
    const uint64_t steps = 2 * o->batches_per_epoch();
    const double t = Best(reps, [&] {
      ids.clear();
      for (uint64_t g = 0; g < steps; ++g) o->AppendBatch(g, *td::RankSlice(b, dp, 3), &ids);
    });
    std::printf(
        "\nrank batches: %llu steps of B=%llu, dp=%llu, rank 3 over two epochs: %.3g samples/s "
        "(of the global order: %.3g samples/s)\n",
        static_cast<unsigned long long>(steps), static_cast<unsigned long long>(b),
        static_cast<unsigned long long>(dp), ids.size() / t, steps * b / t);
  }

  const std::string dir =
      fs::temp_directory_path() / ("tenplex-data-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::printf("\nFUSE read of rank 0's file (MB/s; ratios = fuse / limit, same bytes, same run)\n");
  std::printf("%-26s %3s %7s %8s %8s %6s %8s %6s %8s\n", "view file", "dp", "MB", "fuse", "plain",
              "ratio", "flat", "ratio", "in-proc");
  {
    Fixture j = MakeJsonl(dir, mib << 20);
    FuseRow(j, "jsonl samples.jsonl", "samples.jsonl", 1, reps);
    FuseRow(j, "jsonl samples.jsonl dp=4", "samples.jsonl", 4, reps);
    Fixture m = MakeMegatron(dir, mib << 20);
    FuseRow(m, "megatron samples.bin", "samples.bin", 1, reps);
    FuseRow(m, "megatron samples.idx", "samples.idx", 1, reps);
  }
  fs::remove_all(dir);
  return 0;
}
