// The copy engine against independent references: the files' bytes read back with
// plain reads, device memory read back through the backend's own copy, chunk tilings
// checked against arithmetic. Every test runs on the CPU backend; the same tests run
// on the CUDA backend where one is built and a device answers (scripts/gpu_check.sh).
#include "tenplex/device/engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include "tenplex/util/file.h"

namespace tenplex::device {
namespace {

namespace fs = std::filesystem;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() & 0xff);
  return s;
}

class TempDir {
 public:
  // In /dev/shm where there is one: the store's medium, and the one whose pages a
  // writable registration may lock (a kernel refuses long-term pins of a disk file's
  // shared writable pages; the engine then falls back to staged, as a GPU run saw).
  TempDir()
      : path_(Base() /
              ("tenplex-device-" + std::to_string(getpid()) + "-" + std::to_string(counter_++))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  static fs::path Base() {
    std::error_code ec;
    return fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string p = (path_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

 private:
  static inline std::atomic<int> counter_{0};
  fs::path path_;
};

// Device buffers of a backend, freed with the test.
class DeviceBuffers {
 public:
  explicit DeviceBuffers(Backend& b) : b_(b) {}
  ~DeviceBuffers() {
    for (void* p : ptrs_) b_.FreeDevice(p);
  }
  uint64_t Alloc(size_t n) {
    auto p = b_.AllocDevice(std::max<size_t>(n, 1));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    ptrs_.push_back(*p);
    return reinterpret_cast<uintptr_t>(*p);
  }
  // Device bytes through the backend's own copy (not the engine).
  std::string Read(uint64_t addr, size_t n) {
    std::string out(n, '\0');
    if (n == 0) return out;
    EXPECT_TRUE(
        b_.CopyAsync(out.data(), reinterpret_cast<void*>(addr), n, Direction::kDeviceToHost, 0)
            .ok());
    EXPECT_TRUE(b_.Synchronize().ok());
    return out;
  }
  void Write(uint64_t addr, const std::string& bytes) {
    if (bytes.empty()) return;
    EXPECT_TRUE(b_.CopyAsync(reinterpret_cast<void*>(addr), bytes.data(), bytes.size(),
                             Direction::kHostToDevice, 0)
                    .ok());
    EXPECT_TRUE(b_.Synchronize().ok());
  }

 private:
  Backend& b_;
  std::vector<void*> ptrs_;
};

std::unique_ptr<CopyEngine> Engine(const std::string& kind, EngineOptions o,
                                   BackendOptions b = {}) {
  b.kind = kind;
  auto e = MakeEngine(b, o);
  if (!e.ok()) return nullptr;
  return std::move(e).value();
}

TEST(SplitChunksTest, TilesEverySpanWithFullChunksButTheLast) {
  std::vector<uint64_t> sizes = {0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 0, 8192};
  std::vector<Span> spans;
  for (uint64_t n : sizes) spans.push_back(Span{"f", 7, n, 1});
  for (uint64_t chunk : {4096ull, 1000ull, 1ull << 20}) {
    std::vector<Chunk> chunks = SplitChunks(spans, chunk);
    size_t k = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      uint64_t want = (sizes[i] + chunk - 1) / chunk, covered = 0;
      for (uint64_t j = 0; j < want; ++j, ++k) {
        ASSERT_LT(k, chunks.size());
        EXPECT_EQ(chunks[k].span, i);
        EXPECT_EQ(chunks[k].offset, covered);
        EXPECT_EQ(chunks[k].bytes, j + 1 < want ? chunk : sizes[i] - covered);
        covered += chunks[k].bytes;
      }
      EXPECT_EQ(covered, sizes[i]);
    }
    EXPECT_EQ(k, chunks.size());
  }
}

class EngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    BackendOptions b;
    b.kind = GetParam();
    auto probe = MakeBackend(b);
    if (!probe.ok())
      GTEST_SKIP() << GetParam() << " backend unavailable here: " << probe.status().ToString();
  }
};

// Spans of assorted sizes around the chunk size, at offsets inside shared files.
struct Fixture {
  std::vector<std::string> data;
  std::vector<Span> spans;
};

// Span i starts at byte i * align of its file: odd offsets for the staged path, pages
// for the registered one (which locks the file's pages in place).
const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
uint64_t AlignFor(Mode mode) { return mode == Mode::kRegistered ? kPage : 13; }

Fixture MakeFixture(TempDir& dir, DeviceBuffers& dev, uint64_t chunk, uint32_t seed,
                    uint64_t align = 13) {
  Fixture f;
  std::vector<uint64_t> sizes = {chunk - 1, chunk, chunk + 1, 0, 5 * chunk + 17, 1, 3 * chunk};
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string prefix = RandomBytes(i * align, seed + 100 + static_cast<uint32_t>(i));
    f.data.push_back(RandomBytes(sizes[i], seed + static_cast<uint32_t>(i)));
    std::string path = dir.Write("t" + std::to_string(i), prefix + f.data.back() + "tail");
    f.spans.push_back(Span{path, prefix.size(), sizes[i], dev.Alloc(sizes[i])});
  }
  return f;
}

TEST_P(EngineTest, RestoreEqualsTheFilesBytesForEveryRingShape) {
  for (int threads : {1, 3}) {
    for (int slots : {1, 2, 4}) {
      for (Mode mode : {Mode::kStaged, Mode::kRegistered}) {
        EngineOptions o{4096, slots, threads, mode};
        auto e = Engine(GetParam(), o);
        ASSERT_NE(e, nullptr);
        TempDir dir;
        DeviceBuffers dev(e->backend());
        Fixture f = MakeFixture(dir, dev, o.chunk_bytes,
                                static_cast<uint32_t>(threads * 10 + slots), AlignFor(mode));
        auto st = e->Restore(f.spans);
        ASSERT_TRUE(st.ok()) << st.status().ToString();
        EXPECT_EQ(st->mode, ModeName(mode));
        EXPECT_EQ(st->chunks, SplitChunks(f.spans, o.chunk_bytes).size());
        for (size_t i = 0; i < f.spans.size(); ++i) {
          EXPECT_EQ(dev.Read(f.spans[i].device, f.data[i].size()), f.data[i])
              << "span " << i << " threads " << threads << " slots " << slots;
        }
      }
    }
  }
}

TEST_P(EngineTest, CommitWritesOnlyTheSpans) {
  for (Mode mode : {Mode::kStaged, Mode::kRegistered}) {
    auto e = Engine(GetParam(), EngineOptions{4096, 2, 2, mode});
    ASSERT_NE(e, nullptr);
    TempDir dir;
    DeviceBuffers dev(e->backend());
    Fixture f = MakeFixture(dir, dev, 4096, 7, AlignFor(mode));
    std::vector<std::string> before, fresh;
    for (size_t i = 0; i < f.spans.size(); ++i) {
      before.push_back(*ReadFile(f.spans[i].path));
      fresh.push_back(RandomBytes(f.data[i].size(), 900 + static_cast<uint32_t>(i)));
      dev.Write(f.spans[i].device, fresh.back());
    }
    auto st = e->Commit(f.spans);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    EXPECT_EQ(st->mode, ModeName(mode));
    for (size_t i = 0; i < f.spans.size(); ++i) {
      std::string want = before[i];
      want.replace(f.spans[i].offset, fresh[i].size(), fresh[i]);
      EXPECT_EQ(*ReadFile(f.spans[i].path), want) << "span " << i << " mode " << ModeName(mode);
    }
  }
}

TEST_P(EngineTest, BadSpansFailBeforeAnyByteMoves) {
  auto e = Engine(GetParam(), EngineOptions{4096, 2, 2, Mode::kStaged});
  ASSERT_NE(e, nullptr);
  TempDir dir;
  DeviceBuffers dev(e->backend());
  std::string ok = dir.Write("ok", std::string(100, 'a'));
  uint64_t d = dev.Alloc(100);
  auto missing = e->Restore({Span{ok, 0, 10, d}, Span{ok + ".nope", 0, 10, d}});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(ok + ".nope"), std::string::npos);
  auto short_file = e->Restore({Span{ok, 60, 50, d}});
  EXPECT_EQ(short_file.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_file.status().message().find("has 100 bytes, the copy needs 110"),
            std::string::npos)
      << short_file.status().message();
  EXPECT_EQ(e->Commit({Span{ok, 0, 10, 0}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Restore({Span{dir.Write("x", ""), UINT64_MAX, 2, d}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Restore({Span{fs::temp_directory_path().string(), 0, 1, d}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(*ReadFile(ok), std::string(100, 'a'));  // the failed commit wrote nothing
  auto empty = e->Restore({});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineTest, ::testing::Values("cpu", "cuda"));

TEST(EngineOptionsTest, AreChecked) {
  EXPECT_EQ(MakeEngine({}, EngineOptions{100, 2, 2, Mode::kAuto}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeEngine({}, EngineOptions{4096, 0, 2, Mode::kAuto}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeEngine({}, EngineOptions{4096, 2, 0, Mode::kAuto}).status().code(),
            StatusCode::kInvalidArgument);
  BackendOptions b;
  b.kind = "tpu";
  EXPECT_EQ(MakeEngine(b, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseMode("fast").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseMode("registered"), Mode::kRegistered);
  if (!CudaBuilt()) {
    b.kind = "cuda";
    auto r = MakeEngine(b, {});
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find("-DTENPLEX_CUDA=ON"), std::string::npos);
  }
}

TEST(EngineFaultsTest, RefusedRegistrationFallsBackToStaging) {
  BackendOptions b;
  b.kind = "cpu";
  b.cpu_fail_register = true;
  auto e = Engine("cpu", EngineOptions{4096, 2, 2, Mode::kRegistered}, b);
  ASSERT_NE(e, nullptr);
  TempDir dir;
  DeviceBuffers dev(e->backend());
  Fixture f = MakeFixture(dir, dev, 4096, 3, kPage);
  auto st = e->Restore(f.spans);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->mode, "staged");
  EXPECT_NE(st->fallback.find("registration refused"), std::string::npos) << st->fallback;
  for (size_t i = 0; i < f.spans.size(); ++i)
    EXPECT_EQ(dev.Read(f.spans[i].device, f.data[i].size()), f.data[i]);
}

TEST(EngineFaultsTest, AnUnalignedSpanIsCopiedStaged) {
  auto e = Engine("cpu", EngineOptions{4096, 2, 2, Mode::kRegistered});
  ASSERT_NE(e, nullptr);
  TempDir dir;
  DeviceBuffers dev(e->backend());
  Fixture f = MakeFixture(dir, dev, 4096, 4, 13);
  auto st = e->Restore(f.spans);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->mode, "staged");
  EXPECT_NE(st->fallback.find("not page-aligned"), std::string::npos) << st->fallback;
  for (size_t i = 0; i < f.spans.size(); ++i)
    EXPECT_EQ(dev.Read(f.spans[i].device, f.data[i].size()), f.data[i]);
}

TEST(EngineFaultsTest, AFailedCopyFailsTheCallAfterTheQueueDrains) {
  for (uint64_t fail : {1ull, 5ull, 12ull}) {
    for (bool commit : {false, true}) {
      BackendOptions b;
      b.kind = "cpu";
      b.cpu_fail_copy = fail;
      auto e = Engine("cpu", EngineOptions{4096, 2, 3, Mode::kStaged}, b);
      ASSERT_NE(e, nullptr);
      TempDir dir;
      DeviceBuffers dev(e->backend());
      Fixture f = MakeFixture(dir, dev, 4096, 11);
      auto st = commit ? e->Commit(f.spans) : e->Restore(f.spans);
      EXPECT_EQ(st.status().code(), StatusCode::kInternal) << "copy " << fail;
      EXPECT_NE(st.status().message().find("injected failure"), std::string::npos);
    }
  }
}

// A CPU backend that records the engine's calls: copy sizes, and how many chunks each
// stream had in flight (recorded, not yet waited for) at most.
class RecordingBackend : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::string description() const override { return inner_->description(); }
  int streams() const override { return inner_->streams(); }
  int events() const override { return inner_->events(); }
  Status BindThread() override { return inner_->BindThread(); }
  Result<void*> AllocPinned(size_t n) override { return inner_->AllocPinned(n); }
  void FreePinned(void* p) override { inner_->FreePinned(p); }
  Result<void*> AllocDevice(size_t n) override { return inner_->AllocDevice(n); }
  void FreeDevice(void* p) override { inner_->FreeDevice(p); }
  Status Register(void* p, size_t n, bool ro) override { return inner_->Register(p, n, ro); }
  void Unregister(void* p) override { inner_->Unregister(p); }
  Status CopyAsync(void* d, const void* s, size_t n, Direction dir, int stream) override {
    std::lock_guard<std::mutex> l(mu_);
    sizes.push_back(n);
    return inner_->CopyAsync(d, s, n, dir, stream);
  }
  Status RecordEvent(int e, int s) override {
    std::lock_guard<std::mutex> l(mu_);
    max_inflight = std::max(max_inflight, ++inflight);
    return inner_->RecordEvent(e, s);
  }
  Status WaitEvent(int e) override {
    Status s = inner_->WaitEvent(e);
    std::lock_guard<std::mutex> l(mu_);
    --inflight;
    return s;
  }
  Status Synchronize() override { return inner_->Synchronize(); }

  std::vector<size_t> sizes;
  int inflight = 0, max_inflight = 0;

 private:
  std::unique_ptr<Backend> inner_;
  std::mutex mu_;
};

TEST(EngineOverlapTest, OneWorkerKeepsItsWholeRingInFlight) {
  BackendOptions b;
  b.kind = "cpu";
  b.events = 4;
  auto rec = std::make_unique<RecordingBackend>(MakeCpuBackend(b));
  RecordingBackend* r = rec.get();
  auto e = CopyEngine::Make(std::move(rec), EngineOptions{4096, 4, 1, Mode::kStaged});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  TempDir dir;
  DeviceBuffers dev((*e)->backend());
  Fixture f = MakeFixture(dir, dev, 4096, 5);
  r->sizes.clear();
  ASSERT_TRUE((*e)->Restore(f.spans).ok());
  EXPECT_EQ(r->max_inflight, 4);  // reading chunk k+3 while chunk k is still copying
  EXPECT_EQ(r->inflight, 0);      // every chunk waited for before the call returned
  std::vector<Chunk> chunks = SplitChunks(f.spans, 4096);
  ASSERT_EQ(r->sizes.size(), chunks.size());
  for (size_t k = 0; k < chunks.size(); ++k) EXPECT_EQ(r->sizes[k], chunks[k].bytes) << k;
}

}  // namespace
}  // namespace tenplex::device
