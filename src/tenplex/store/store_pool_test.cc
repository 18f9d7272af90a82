// The page pool (store.h): released files recycled for the same job, bounded, counted
// against the memory limit, never served and never kept across a restart.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "tenplex/store/store.h"
#include "tenplex/util/hash.h"

namespace tenplex::store {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1 << 20;

std::vector<uint8_t> RandomBytes(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::unique_ptr<Store> OpenStore(StoreOptions o = {}) {
  auto s = Store::Open(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

StoreOptions PoolOf(uint64_t pool, uint64_t limit = 0, const std::string& dir = "") {
  StoreOptions o;
  o.shm_dir = dir;
  o.memory_limit = limit;
  o.page_pool_bytes = pool;
  return o;
}

// F32 shape of `bytes` bytes.
Shape ShapeOf(uint64_t bytes) { return {static_cast<int64_t>(bytes / 4)}; }

std::string Path(const std::string& job, uint64_t v, const std::string& name) {
  return "jobs/" + job + "/" + std::to_string(v) + "/rank-00000/" + name;
}

// Allocates a tensor and writes random bytes through its map (as a transform does);
// returns the bytes.
std::vector<uint8_t> Write(Store& s, const std::string& path, uint64_t bytes, uint64_t seed) {
  auto w = s.Allocate(path, DType::kF32, ShapeOf(bytes));
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  auto data = RandomBytes(bytes, seed);
  if (w.ok()) std::memcpy(w->data(), data.data(), bytes);
  return data;
}

ino_t Inode(const std::string& file) {
  struct stat st;
  EXPECT_EQ(::stat(file.c_str(), &st), 0) << file;
  return st.st_ino;
}

std::size_t FilesIn(const std::string& dir) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::end(it); ++it)
    n += it->is_regular_file() ? 1 : 0;
  return n;
}

std::vector<uint8_t> Read(Store& s, const std::string& path) {
  auto r = s.Get(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {};
  return std::vector<uint8_t>(r->data(), r->data() + r->size());
}

// Commits version v of job (with one small tensor) so that older versions are released.
void CommitSmall(Store& s, const std::string& job, uint64_t v) {
  ASSERT_TRUE(s.BeginVersion(job, v).ok());
  ASSERT_TRUE(s.Put(Path(job, v, "small"), DType::kU8, {16}, RandomBytes(16, v).data(), 16).ok());
  ASSERT_TRUE(s.Commit(job, v).ok());
}

TEST(PoolTest, RecycledFilesGiveByteExactTensors) {
  auto s = OpenStore(PoolOf(64 * kMiB));
  ASSERT_TRUE(s->BeginVersion("j", 1).ok());
  Write(*s, Path("j", 1, "a"), 1 * kMiB, 1);
  Write(*s, Path("j", 1, "b"), 2 * kMiB, 2);
  Write(*s, Path("j", 1, "c"), 4 * kMiB, 3);
  ASSERT_TRUE(s->Commit("j", 1).ok());
  std::set<ino_t> old;
  for (const char* n : {"a", "b", "c"}) old.insert(Inode(s->shm_dir() + "/" + Path("j", 1, n)));
  CommitSmall(*s, "j", 2);
  EXPECT_EQ(s->pool_bytes(), 7 * kMiB);
  EXPECT_EQ(FilesIn(s->shm_dir() + "/pool"), 3u);

  ASSERT_TRUE(s->BeginVersion("j", 3).ok());
  // Allocate promises zeros: a recycled file (the 2 MiB one, best fit) must not show
  // the old tensor's bytes.
  auto w = s->Allocate(Path("j", 3, "x"), DType::kF32, ShapeOf(3 * kMiB / 2));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(std::vector<uint8_t>(w->data(), w->data() + w->size()),
            std::vector<uint8_t>(3 * kMiB / 2, 0));
  EXPECT_TRUE(old.count(Inode(w->info().file)));
  EXPECT_EQ(s->pool_bytes(), 5 * kMiB);
  auto x = RandomBytes(3 * kMiB / 2, 10);
  std::memcpy(w->data() + 4096, x.data() + 4096, x.size() - 8192);  // leaves both ends zero
  std::fill(x.begin(), x.begin() + 4096, 0);
  std::fill(x.end() - 4096, x.end(), 0);
  // Put overwrites every byte (the 1 MiB file); a short one is refused and leaves
  // nothing behind.
  auto y = RandomBytes(kMiB, 11);
  auto put = s->Put(Path("j", 3, "y"), DType::kF32, ShapeOf(kMiB), y.data(), y.size());
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_TRUE(old.count(Inode(put->file)));
  auto short_put = s->PutFrom(Path("j", 3, "z"), DType::kF32, ShapeOf(4 * kMiB),
                              [&](TensorSink& sink) { return sink.Write(y.data(), y.size()); });
  EXPECT_EQ(short_put.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->Get(Path("j", 3, "z")).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(s->Commit("j", 3).ok());
  EXPECT_EQ(Read(*s, Path("j", 3, "x")), x);
  EXPECT_EQ(Read(*s, Path("j", 3, "y")), y);
  // The recorded checksums are those of the reference bytes.
  EXPECT_EQ(*s->Checksum(Path("j", 3, "x")), Xxh64Hex(x.data(), x.size()));
  EXPECT_EQ(*s->Checksum(Path("j", 3, "y")), Xxh64Hex(y.data(), y.size()));
  EXPECT_EQ(s->used_bytes(), 3 * kMiB / 2 + kMiB);  // version 2 released
}

TEST(PoolTest, PoolIsBoundedByItsLimitKeepingTheNewestFiles) {
  auto s = OpenStore(PoolOf(3 * kMiB));
  EXPECT_EQ(s->page_pool_limit(), 3 * kMiB);
  ASSERT_TRUE(s->BeginVersion("j", 1).ok());
  for (int i = 0; i < 4; ++i) Write(*s, Path("j", 1, "t" + std::to_string(i)), kMiB, i);
  ASSERT_TRUE(s->Commit("j", 1).ok());
  ASSERT_TRUE(s->BeginVersion("j", 2).ok());
  Write(*s, Path("j", 2, "a"), kMiB, 7);
  Write(*s, Path("j", 2, "b"), kMiB, 8);
  std::set<ino_t> v2{Inode(s->shm_dir() + "/" + Path("j", 2, "a")),
                     Inode(s->shm_dir() + "/" + Path("j", 2, "b"))};
  // (Version 1 is still current here: these are new files.)
  ASSERT_TRUE(s->Commit("j", 2).ok());
  EXPECT_EQ(s->pool_bytes(), 3 * kMiB);
  EXPECT_EQ(FilesIn(s->shm_dir() + "/pool"), 3u);
  CommitSmall(*s, "j", 3);  // releases version 2: its two files are the newest
  EXPECT_EQ(s->pool_bytes(), 3 * kMiB);
  EXPECT_EQ(FilesIn(s->shm_dir() + "/pool"), 3u);
  std::set<ino_t> pooled;
  for (const auto& e : fs::directory_iterator(s->shm_dir() + "/pool"))
    pooled.insert(Inode(e.path().string()));
  for (ino_t i : v2) EXPECT_TRUE(pooled.count(i));
  // Off: nothing is kept.
  auto off = OpenStore(PoolOf(0));
  ASSERT_TRUE(off->BeginVersion("j", 1).ok());
  Write(*off, Path("j", 1, "a"), kMiB, 1);
  ASSERT_TRUE(off->Commit("j", 1).ok());
  CommitSmall(*off, "j", 2);
  EXPECT_EQ(off->pool_bytes(), 0u);
  EXPECT_EQ(FilesIn(off->shm_dir() + "/pool"), 0u);
}

TEST(PoolTest, MemoryLimitCountsThePoolAndEvictsItFirst) {
  auto s = OpenStore(PoolOf(8 * kMiB, 8 * kMiB));
  ASSERT_TRUE(s->BeginVersion("a", 1).ok());
  for (int i = 0; i < 3; ++i) Write(*s, Path("a", 1, "t" + std::to_string(i)), 2 * kMiB, i);
  ASSERT_TRUE(s->Commit("a", 1).ok());
  CommitSmall(*s, "a", 2);
  EXPECT_EQ(s->pool_bytes(), 6 * kMiB);
  EXPECT_EQ(s->used_bytes(), 16u);
  // Job b needs 5 MiB: 16 + 6 MiB pooled + 5 MiB > 8 MiB, so pooled files go (job a's
  // files are never given to b).
  ASSERT_TRUE(s->BeginVersion("b", 1).ok());
  auto w = s->Allocate(Path("b", 1, "w"), DType::kF32, ShapeOf(5 * kMiB));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_LE(s->used_bytes() + s->pool_bytes(), 8 * kMiB);
  EXPECT_EQ(s->pool_bytes(), 2 * kMiB);
  EXPECT_EQ(FilesIn(s->shm_dir() + "/pool"), 1u);
  // Reservations count it too; what does not fit even with the pool empty is refused,
  // naming the limit.
  auto r = s->Reserve(2 * kMiB, "a probe");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(s->pool_bytes(), 0u);
  EXPECT_EQ(FilesIn(s->shm_dir() + "/pool"), 0u);
  auto too_big = s->Allocate(Path("b", 1, "v"), DType::kF32, ShapeOf(kMiB));
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("--memory-limit"), std::string::npos);
}

TEST(PoolTest, JobsNeverShareFiles) {
  auto s = OpenStore(PoolOf(64 * kMiB));
  ASSERT_TRUE(s->BeginVersion("a", 1).ok());
  Write(*s, Path("a", 1, "w"), 2 * kMiB, 1);
  ASSERT_TRUE(s->Commit("a", 1).ok());
  const ino_t a_file = Inode(s->shm_dir() + "/" + Path("a", 1, "w"));
  CommitSmall(*s, "a", 2);
  ASSERT_EQ(s->pool_bytes(), 2 * kMiB);
  ASSERT_TRUE(s->BeginVersion("b", 1).ok());
  auto w = s->Allocate(Path("b", 1, "w"), DType::kF32, ShapeOf(2 * kMiB));
  ASSERT_TRUE(w.ok());
  EXPECT_NE(Inode(w->info().file), a_file);
  EXPECT_EQ(s->pool_bytes(), 2 * kMiB);
  auto y = RandomBytes(2 * kMiB, 5);
  auto put = s->Put(Path("b", 1, "y"), DType::kF32, ShapeOf(2 * kMiB), y.data(), y.size());
  ASSERT_TRUE(put.ok());
  EXPECT_NE(Inode(put->file), a_file);
  EXPECT_EQ(s->pool_bytes(), 2 * kMiB);
  // Deleting job a drops its pooled files.
  ASSERT_TRUE(s->DeleteJob("a").ok());
  EXPECT_EQ(s->pool_bytes(), 0u);
  EXPECT_EQ(FilesIn(s->shm_dir() + "/pool"), 0u);
}

TEST(PoolTest, FilesStillInUseAreNeverPooled) {
  auto s = OpenStore(PoolOf(64 * kMiB));
  ASSERT_TRUE(s->BeginVersion("j", 1).ok());
  auto held = Write(*s, Path("j", 1, "held"), 2 * kMiB, 1);
  Write(*s, Path("j", 1, "linked"), 2 * kMiB, 2);
  Write(*s, Path("j", 1, "free"), 2 * kMiB, 3);
  ASSERT_TRUE(s->Commit("j", 1).ok());
  auto ref = s->Get(Path("j", 1, "held"));  // a reader still holds it
  ASSERT_TRUE(ref.ok());
  ASSERT_TRUE(s->BeginVersion("j", 2).ok());
  ASSERT_TRUE(s->Link(Path("j", 1, "linked"), Path("j", 2, "linked")).ok());
  auto linked = Read(*s, Path("j", 1, "linked"));
  ASSERT_TRUE(s->Commit("j", 2).ok());
  EXPECT_EQ(s->pool_bytes(), 2 * kMiB);  // only "free"
  // An open version's files may still be written by another process: never pooled.
  ASSERT_TRUE(s->BeginVersion("j", 3).ok());
  Write(*s, Path("j", 3, "open"), 2 * kMiB, 4);  // takes "free" from the pool
  EXPECT_EQ(s->pool_bytes(), 0u);
  ASSERT_TRUE(s->DropVersion("j", 3).ok());
  EXPECT_EQ(s->pool_bytes(), 0u);
  // New tensors of the job, recycling what there is: the reader's and the linked bytes
  // do not change.
  ASSERT_TRUE(s->BeginVersion("j", 4).ok());
  for (int i = 0; i < 3; ++i) Write(*s, Path("j", 4, "n" + std::to_string(i)), 2 * kMiB, 9 + i);
  EXPECT_EQ(s->pool_bytes(), 0u);
  EXPECT_EQ(std::vector<uint8_t>(ref->data(), ref->data() + ref->size()), held);
  EXPECT_EQ(Read(*s, Path("j", 2, "linked")), linked);
  // Released tensors are not served, whether pooled or not.
  EXPECT_EQ(s->Get(Path("j", 1, "free")).status().code(), StatusCode::kNotFound);
  auto all = s->List("jobs/");
  ASSERT_TRUE(all.ok());
  for (const TensorInfo& t : *all) EXPECT_EQ(t.path.find("/pool/"), std::string::npos);
  EXPECT_EQ(all->size(), 4u);  // version 2's linked tensor, version 4's three
}

// Waits (up to 20 s) until the pool holds `bytes`.
bool PoolReaches(const Store& s, uint64_t bytes) {
  for (int i = 0; i < 2000 && s.pool_bytes() != bytes; ++i) ::usleep(10000);
  return s.pool_bytes() == bytes;
}

TEST(PoolTest, PresizeFillsThePoolForTheNextVersionWithinTheLimits) {
  StoreOptions o = PoolOf(64 * kMiB);
  o.presize_pool = true;
  auto s = OpenStore(o);
  ASSERT_TRUE(s->BeginVersion("j", 1).ok());
  Write(*s, Path("j", 1, "a"), kMiB, 1);
  Write(*s, Path("j", 1, "b"), 2 * kMiB, 2);
  ASSERT_TRUE(s->Commit("j", 1).ok());
  ASSERT_TRUE(PoolReaches(*s, 3 * kMiB));
  std::set<ino_t> pooled;
  for (const auto& e : fs::directory_iterator(s->shm_dir() + "/pool"))
    pooled.insert(Inode(e.path().string()));
  EXPECT_EQ(pooled.size(), 2u);
  ASSERT_TRUE(s->BeginVersion("j", 2).ok());
  auto w = s->Allocate(Path("j", 2, "b"), DType::kF32, ShapeOf(2 * kMiB));
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(pooled.count(Inode(w->info().file)));
  EXPECT_EQ(std::vector<uint8_t>(w->data(), w->data() + w->size()),
            std::vector<uint8_t>(2 * kMiB, 0));
  auto b = RandomBytes(2 * kMiB, 3);
  std::memcpy(w->data(), b.data(), b.size());
  ASSERT_TRUE(s->Commit("j", 2).ok());
  EXPECT_EQ(Read(*s, Path("j", 2, "b")), b);
  EXPECT_EQ(Read(*s, "jobs/j/current/rank-00000/b"), b);

  // Only free room is used: with 4 MiB allowed and 3 MiB held, one 1 MiB file.
  StoreOptions tight = PoolOf(64 * kMiB, 4 * kMiB);
  tight.presize_pool = true;
  auto t = OpenStore(tight);
  ASSERT_TRUE(t->BeginVersion("j", 1).ok());
  Write(*t, Path("j", 1, "a"), kMiB, 1);
  Write(*t, Path("j", 1, "b"), 2 * kMiB, 2);
  ASSERT_TRUE(t->Commit("j", 1).ok());
  ASSERT_TRUE(PoolReaches(*t, kMiB));
  ::usleep(100000);
  EXPECT_EQ(t->pool_bytes(), kMiB);
  EXPECT_LE(t->used_bytes() + t->pool_bytes(), 4 * kMiB);
}

// A host that holds nothing of the job yet (one joining a transform) pre-sizes on
// request: the files are the job's, serve its first version's tensors zeroed and
// byte-exact, and stay within the pool bound and the memory limit.
TEST(PoolTest, FillPoolPresizesForAJobThisHostDoesNotHoldYet) {
  auto s = OpenStore(PoolOf(64 * kMiB));
  // Sizes below the pool's minimum are skipped; asking twice adds nothing.
  auto got = s->FillPool("new", {kMiB, 2 * kMiB, 100});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, 3 * kMiB);
  EXPECT_EQ(*s->FillPool("new", {kMiB, 2 * kMiB}), 3 * kMiB);
  EXPECT_EQ(s->pool_bytes(), 3 * kMiB);
  EXPECT_EQ(s->used_bytes(), 0u);
  std::set<ino_t> pooled;
  for (const auto& e : fs::directory_iterator(s->shm_dir() + "/pool"))
    pooled.insert(Inode(e.path().string()));
  EXPECT_EQ(pooled.size(), 2u);
  // Another job does not take them.
  ASSERT_TRUE(s->BeginVersion("other", 1).ok());
  auto o = s->Allocate(Path("other", 1, "a"), DType::kF32, ShapeOf(kMiB));
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(pooled.count(Inode(o->info().file)));
  EXPECT_EQ(s->pool_bytes(), 3 * kMiB);

  ASSERT_TRUE(s->BeginVersion("new", 1).ok());
  std::vector<std::vector<uint8_t>> want;
  for (uint64_t bytes : {2 * kMiB, kMiB}) {
    const std::string name = "t" + std::to_string(bytes);
    auto w = s->Allocate(Path("new", 1, name), DType::kF32, ShapeOf(bytes));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_TRUE(pooled.count(Inode(w->info().file))) << name;
    EXPECT_EQ(std::vector<uint8_t>(w->data(), w->data() + w->size()),
              std::vector<uint8_t>(bytes, 0));
    want.push_back(RandomBytes(bytes, bytes));
    std::memcpy(w->data(), want.back().data(), bytes);
  }
  EXPECT_EQ(s->pool_bytes(), 0u);
  ASSERT_TRUE(s->Commit("new", 1).ok());
  EXPECT_EQ(Read(*s, Path("new", 1, "t" + std::to_string(2 * kMiB))), want[0]);
  EXPECT_EQ(Read(*s, Path("new", 1, "t" + std::to_string(kMiB))), want[1]);

  // Only free room: 4 MiB allowed, 1 MiB held, so one 2 MiB file of the three asked.
  auto t = OpenStore(PoolOf(64 * kMiB, 4 * kMiB));
  ASSERT_TRUE(t->BeginVersion("j", 1).ok());
  Write(*t, Path("j", 1, "a"), kMiB, 1);
  EXPECT_EQ(*t->FillPool("k", {2 * kMiB, 2 * kMiB, 2 * kMiB}), 2 * kMiB);
  EXPECT_LE(t->used_bytes() + t->pool_bytes(), 4 * kMiB);
  // The pool's bound too, and a pool that is off says so.
  auto b = OpenStore(PoolOf(3 * kMiB));
  EXPECT_EQ(*b->FillPool("k", {2 * kMiB, 2 * kMiB}), 2 * kMiB);
  auto off = OpenStore(PoolOf(0));
  EXPECT_EQ(off->FillPool("k", {2 * kMiB}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(off->FillPool("../x", {2 * kMiB}).status().code(), StatusCode::kInvalidArgument);
}

// A pre-sized file is taken without zeroing it again (it was never written); once a
// tensor has written it and its version is released, it is a dirty file like any
// other and is zeroed when recycled. Either way the new tensor reads all zeros.
TEST(PoolTest, CleanPresizedFilesSkipZeroingDirtyOnesDoNot) {
  auto s = OpenStore(PoolOf(64 * kMiB));
  ASSERT_EQ(*s->FillPool("j", {4 * kMiB}), 4 * kMiB);
  const ino_t pre = Inode(fs::directory_iterator(s->shm_dir() + "/pool")->path().string());
  EXPECT_EQ(s->pool_clean_reused_bytes(), 0u);
  ASSERT_TRUE(s->BeginVersion("j", 1).ok());
  {
    // A smaller tensor takes it (truncated): still all zeros, counted as clean.
    auto w = s->Allocate(Path("j", 1, "a"), DType::kF32, ShapeOf(3 * kMiB));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(Inode(w->info().file), pre);
    EXPECT_EQ(std::vector<uint8_t>(w->data(), w->data() + w->size()),
              std::vector<uint8_t>(3 * kMiB, 0));
    EXPECT_EQ(s->pool_clean_reused_bytes(), 3 * kMiB);
    auto a = RandomBytes(3 * kMiB, 7);
    std::memcpy(w->data(), a.data(), a.size());
  }  // the writer's map is released
  ASSERT_TRUE(s->Commit("j", 1).ok());
  CommitSmall(*s, "j", 2);  // version 1 released: its file is pooled, dirty
  EXPECT_EQ(s->pool_bytes(), 3 * kMiB);

  ASSERT_TRUE(s->BeginVersion("j", 3).ok());
  auto x = s->Allocate(Path("j", 3, "x"), DType::kF32, ShapeOf(2 * kMiB));
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  EXPECT_EQ(Inode(x->info().file), pre);  // the same file, now dirty
  EXPECT_EQ(std::vector<uint8_t>(x->data(), x->data() + x->size()),
            std::vector<uint8_t>(2 * kMiB, 0));
  EXPECT_EQ(s->pool_clean_reused_bytes(), 3 * kMiB);  // zeroed, not counted
}

TEST(PoolTest, RestartIgnoresAndClearsALeftoverPool) {
  std::string dir = "/dev/shm/tenplex-pool-test-" + std::to_string(::getpid());
  if (!fs::is_directory("/dev/shm")) dir = fs::temp_directory_path().string() + dir.substr(8);
  std::vector<uint8_t> w;
  {
    auto s = OpenStore(PoolOf(64 * kMiB, 0, dir));
    ASSERT_TRUE(s->BeginVersion("j", 1).ok());
    Write(*s, Path("j", 1, "w"), 2 * kMiB, 1);
    ASSERT_TRUE(s->Commit("j", 1).ok());
    ASSERT_TRUE(s->BeginVersion("j", 2).ok());
    w = Write(*s, Path("j", 2, "w"), 2 * kMiB, 2);
    ASSERT_TRUE(s->Commit("j", 2).ok());
    ASSERT_EQ(s->pool_bytes(), 2 * kMiB);
  }
  // What a killed store leaves: pooled files, even ones laid out like a version.
  fs::create_directories(dir + "/pool/jobs/j/3/rank-00000");
  {
    std::FILE* f = std::fopen((dir + "/pool/jobs/j/3/rank-00000/w").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("stale", f);
    std::fclose(f);
    f = std::fopen((dir + "/pool/17").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  {
    auto s = OpenStore(PoolOf(64 * kMiB, 0, dir));
    EXPECT_EQ(s->pool_bytes(), 0u);
    EXPECT_EQ(FilesIn(dir + "/pool"), 0u);
    EXPECT_EQ(s->used_bytes(), 2 * kMiB);
    auto job = s->Job("j");
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->current, 2u);
    EXPECT_EQ(job->versions.size(), 1u);
    EXPECT_EQ(Read(*s, "jobs/j/current/rank-00000/w"), w);
    EXPECT_TRUE(s->Checksum("jobs/j/current/rank-00000/w").ok());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tenplex::store
