#include "tenplex/store/store.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "tenplex/store/mapping.h"
#include "tenplex/util/file.h"
#include "tenplex/util/hash.h"

namespace tenplex::store {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> RandomBytes(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> Bytes(const TensorRef& r) {
  return std::vector<uint8_t>(r.data(), r.data() + r.size());
}

std::unique_ptr<Store> OpenStore(StoreOptions o = {}) {
  auto s = Store::Open(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

// A fresh directory for a persistent store, removed at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    path = "/dev/shm/tenplex-test-" + std::to_string(::getpid()) + "-" +
           std::to_string(std::random_device()());
    if (!fs::is_directory("/dev/shm")) path = fs::temp_directory_path().string() + path.substr(8);
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(StoreTest, VersionsCommitAndImmutability) {
  auto store = OpenStore();
  auto a = RandomBytes(24, 1);
  EXPECT_EQ(store->Get("jobs/j/current/rank-00000/w").status().code(), StatusCode::kNotFound);
  auto v1 = store->BeginVersion("j");
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(*v1, 1u);
  auto put = store->Put("jobs/j/1/rank-00000/w", DType::kF32, {2, 3}, a.data(), a.size());
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->bytes, 24u);
  EXPECT_FALSE(put->committed);
  // Not committed yet: current does not exist, the open version is readable by number.
  EXPECT_EQ(store->Get("jobs/j/current/rank-00000/w").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Bytes(*store->Get("jobs/j/1/rank-00000/w")), a);
  ASSERT_TRUE(store->Commit("j", 1).ok());

  auto cur = store->Get("jobs/j/current/rank-00000/w");
  ASSERT_TRUE(cur.ok());
  EXPECT_EQ(Bytes(*cur), a);
  EXPECT_TRUE(cur->info().committed);
  EXPECT_EQ(cur->info().path, "jobs/j/1/rank-00000/w");
  EXPECT_EQ(cur->info().shape, (Shape{2, 3}));

  // Every kind of write into the committed version fails and changes nothing.
  auto b = RandomBytes(24, 2);
  for (const char* p :
       {"jobs/j/1/rank-00000/w", "jobs/j/current/rank-00000/w", "jobs/j/1/rank-00000/new"}) {
    EXPECT_EQ(store->Put(p, DType::kF32, {2, 3}, b.data(), b.size()).status().code(),
              StatusCode::kFailedPrecondition)
        << p;
    EXPECT_EQ(store->Allocate(p, DType::kF32, {2, 3}).status().code(),
              StatusCode::kFailedPrecondition)
        << p;
    EXPECT_EQ(store->Delete(p).code(), StatusCode::kFailedPrecondition) << p;
  }
  EXPECT_EQ(store->SetVersionInfo("j", 1, "{}").code(), StatusCode::kFailedPrecondition);
  // Committing the current version again is a no-op (a lost reply asked again).
  EXPECT_TRUE(store->Commit("j", 1).ok());
  EXPECT_EQ(Bytes(*store->Get("jobs/j/current/rank-00000/w")), a);
  EXPECT_EQ(store->List("jobs/j/").value().size(), 1u);

  // Version 2 is built beside 1; committing it releases 1.
  auto v2 = store->BeginVersion("j", std::nullopt, R"({"step": 7})");
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(*v2, 2u);
  auto w = store->Allocate("jobs/j/2/rank-00001/w", DType::kI64, {3});
  ASSERT_TRUE(w.ok());
  for (uint64_t i = 0; i < w->size(); ++i) EXPECT_EQ(w->data()[i], 0);  // zero-filled
  int64_t vals[3] = {5, -6, 7};
  std::memcpy(w->data(), vals, sizeof(vals));
  EXPECT_EQ(Bytes(*store->Get("jobs/j/current/rank-00000/w")), a);  // 1 still current
  TensorRef old = *store->Get("jobs/j/1/rank-00000/w");
  ASSERT_TRUE(store->Commit("j", 2).ok());
  EXPECT_EQ(store->Commit("j", 1).code(), StatusCode::kNotFound);  // released
  EXPECT_EQ(store->Get("jobs/j/1/rank-00000/w").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Get("jobs/j/current/rank-00000/w").status().code(), StatusCode::kNotFound);
  auto got = store->Get("jobs/j/current/rank-00001/w");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::memcmp(got->data(), vals, sizeof(vals)), 0);
  EXPECT_EQ(Bytes(old), a);  // a reference outlives the release
  EXPECT_EQ(store->used_bytes(), 24u);
  auto vi = store->Version("j", std::nullopt);
  ASSERT_TRUE(vi.ok());
  EXPECT_EQ(vi->version, 2u);
  EXPECT_EQ(vi->info, R"({"step":7})");
  EXPECT_FALSE(fs::exists(store->shm_dir() + "/jobs/j/1"));
}

TEST(StoreTest, LinkSharesACommittedTensorAcrossVersions) {
  auto store = OpenStore();
  auto a = RandomBytes(4096 * 3, 7);
  ASSERT_TRUE(store->BeginVersion("j").ok());
  ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/w", DType::kU8, {4096 * 3}, a.data(), a.size()).ok());
  // Only committed sources; only open destinations.
  EXPECT_EQ(store->Link("jobs/j/1/rank-00000/w", "jobs/j/1/rank-00001/w").status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->Commit("j", 1, /*keep_old=*/true).ok());
  ASSERT_TRUE(store->BeginVersion("j", 2).ok());
  EXPECT_EQ(store->Link("jobs/j/1/rank-00000/x", "jobs/j/2/rank-00001/w").status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(store->Link("jobs/j/1/rank-00000/w", "jobs/j/1/rank-00001/w").status().code(),
            StatusCode::kFailedPrecondition);
  const uint64_t used = store->used_bytes();
  Result<TensorInfo> l = store->Link("jobs/j/1/rank-00000/w", "jobs/j/2/rank-00001/w");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->dtype, DType::kU8);
  EXPECT_EQ(l->shape, (Shape{4096 * 3}));
  EXPECT_EQ(store->used_bytes(), used + a.size());
  EXPECT_EQ(Bytes(*store->Get("jobs/j/2/rank-00001/w")), a);
  // Committing 2 releases 1; the linked tensor keeps its bytes, and the accounting
  // drops the released copy.
  ASSERT_TRUE(store->Commit("j", 2).ok());
  EXPECT_EQ(store->Commit("j", 1).code(), StatusCode::kNotFound);  // released
  EXPECT_EQ(store->Get("jobs/j/1/rank-00000/w").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Bytes(*store->Get("jobs/j/current/rank-00001/w")), a);
  EXPECT_EQ(store->used_bytes(), used);
  EXPECT_EQ(*store->Checksum("jobs/j/2/rank-00001/w"), Xxh64Hex(a.data(), a.size()));
}

TEST(StoreTest, ExplicitVersionNumbersAndKeepOld) {
  auto store = OpenStore();
  ASSERT_EQ(*store->BeginVersion("j", 3), 3u);
  uint8_t x = 1;
  ASSERT_TRUE(store->Put("jobs/j/3/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_EQ(*store->BeginVersion("j", 5), 5u);  // supersedes the open version 3 (fencing)
  EXPECT_EQ(store->BeginVersion("j", 5).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store->BeginVersion("j", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->BeginVersion("j", 4).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->Put("jobs/j/5/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_TRUE(store->Commit("j", 5, /*keep_old=*/true).ok());
  EXPECT_EQ(store->Commit("j", 3).code(), StatusCode::kFailedPrecondition);  // superseded
  EXPECT_EQ(store->BeginVersion("j", 4).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*store->BeginVersion("j"), 6u);
  ASSERT_TRUE(store->Put("jobs/j/6/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_TRUE(store->Commit("j", 6, /*keep_old=*/true).ok());
  // 5 is kept (committed, readable), 3 (open) too until released or dropped.
  EXPECT_TRUE(store->Get("jobs/j/5/rank-00000/x").ok());
  EXPECT_EQ(store->Commit("j", 5).code(), StatusCode::kFailedPrecondition);  // kept, not current
  EXPECT_EQ(store->DropVersion("j", 6).code(), StatusCode::kFailedPrecondition);  // current
  ASSERT_TRUE(store->ReleaseOld("j").ok());
  EXPECT_FALSE(store->Get("jobs/j/5/rank-00000/x").ok());
  EXPECT_TRUE(store->Get("jobs/j/3/rank-00000/x").ok());  // open versions are not "old committed"
  ASSERT_TRUE(store->DropVersion("j", 3).ok());
  auto job = store->Job("j");
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->versions.size(), 1u);
  EXPECT_EQ(job->current, 6u);
  EXPECT_EQ(store->used_bytes(), 1u);
  ASSERT_TRUE(store->DeleteJob("j").ok());
  EXPECT_EQ(store->used_bytes(), 0u);
  EXPECT_TRUE(store->Jobs().empty());
  EXPECT_EQ(store->Job("j").status().code(), StatusCode::kNotFound);
}

// Store::OnRelease: a listener hears of every release (not of commits that keep the
// older versions), after the released tensors are gone, with no store lock held (it can
// call the store), and never again once its handle is destroyed.
TEST(StoreTest, ReleaseListenersHearOfEveryReleaseAfterIt) {
  auto store = OpenStore();
  std::vector<std::string> heard;
  std::vector<bool> v1_gone;
  std::shared_ptr<void> handle = store->OnRelease([&](const std::string& job) {
    heard.push_back(job);
    v1_gone.push_back(!store->Meta("jobs/j/1/rank-00000/x").ok());
  });
  uint8_t x = 1;
  auto put_commit = [&](uint64_t v, bool keep_old) {
    ASSERT_TRUE(store->BeginVersion("j", v).ok());
    ASSERT_TRUE(store->Put(TensorPathOf("j", v, 0, "x"), DType::kU8, {1}, &x, 1).ok());
    ASSERT_TRUE(store->Commit("j", v, keep_old).ok());
  };
  put_commit(1, false);  // nothing older
  put_commit(2, true);   // 1 kept
  EXPECT_TRUE(heard.empty());
  ASSERT_TRUE(store->ReleaseOld("j").ok());  // releases 1
  EXPECT_EQ(heard.size(), 1u);
  put_commit(3, false);  // releases 2
  EXPECT_EQ(heard.size(), 2u);
  ASSERT_TRUE(store->BeginVersion("j", 4).ok());
  ASSERT_TRUE(store->DropVersion("j", 4).ok());
  EXPECT_EQ(heard.size(), 3u);
  ASSERT_TRUE(store->DeleteJob("j").ok());
  EXPECT_EQ(heard, std::vector<std::string>(4, "j"));
  EXPECT_EQ(v1_gone, std::vector<bool>(4, true));
  handle.reset();
  put_commit(1, false);
  put_commit(2, false);
  ASSERT_TRUE(store->DeleteJob("j").ok());
  EXPECT_EQ(heard.size(), 4u);
}

TEST(StoreTest, MemoryLimit) {
  auto store = OpenStore({.shm_dir = "", .memory_limit = 1000});
  EXPECT_EQ(store->memory_limit(), 1000u);
  ASSERT_TRUE(store->BeginVersion("j").ok());
  std::vector<uint8_t> buf(1000, 7);
  ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/a", DType::kU8, {800}, buf.data(), 800).ok());
  auto over = store->Put("jobs/j/1/rank-00000/b", DType::kU8, {300}, buf.data(), 300);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("memory limit"), std::string::npos)
      << over.status().message();
  EXPECT_EQ(store->Allocate("jobs/j/1/rank-00000/b", DType::kF64, {1LL << 40}).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Meta("jobs/j/1/rank-00000/b").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->used_bytes(), 800u);
  ASSERT_TRUE(store->Delete("jobs/j/1/rank-00000/a").ok());
  EXPECT_EQ(store->used_bytes(), 0u);
  EXPECT_TRUE(store->Put("jobs/j/1/rank-00000/b", DType::kU8, {300}, buf.data(), 300).ok());
  // A batch over the limit creates nothing.
  auto many = store->AllocateMany(
      {{"jobs/j/1/rank-00000/c", DType::kU8, {400}}, {"jobs/j/1/rank-00000/d", DType::kU8, {400}}});
  EXPECT_EQ(many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store->List("jobs/j/1/").value().size(), 1u);
  EXPECT_EQ(store->used_bytes(), 300u);
}

TEST(StoreTest, BadRequestsChangeNothing) {
  auto store = OpenStore();
  ASSERT_TRUE(store->BeginVersion("j").ok());
  auto a = RandomBytes(8, 3);
  ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/w", DType::kF32, {2}, a.data(), 8).ok());
  auto b = RandomBytes(16, 4);
  // Size mismatch, bad paths, unknown version, overflowing shapes, batch with a bad item.
  EXPECT_EQ(store->Put("jobs/j/1/rank-00000/w", DType::kF32, {2}, b.data(), 16).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Put("jobs/j/1/rank-00000/../w", DType::kF32, {4}, b.data(), 16).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Put("jobs/j/9/rank-00000/w", DType::kF32, {4}, b.data(), 16).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(store->Allocate("jobs/j/1/rank-00000/w", DType::kF32, {-1}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Allocate("jobs/j/1/rank-00000/w", DType::kF32, {1LL << 62, 4}).status().code(),
            StatusCode::kInvalidArgument);
  auto batch = store->AllocateMany(
      {{"jobs/j/1/rank-00000/ok", DType::kU8, {4}}, {"jobs/j/1/rank-00000/x/y", DType::kU8, {4}}});
  EXPECT_EQ(batch.status().code(), StatusCode::kInvalidArgument);
  auto twice = store->AllocateMany(
      {{"jobs/j/1/rank-00000/t", DType::kU8, {4}}, {"jobs/j/1/rank-00000/t", DType::kU8, {4}}});
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->BeginVersion("bad/job").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->BeginVersion("j", std::nullopt, "[1]").status().code(),
            StatusCode::kInvalidArgument);
  auto list = store->List("jobs/");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].path, "jobs/j/1/rank-00000/w");
  EXPECT_EQ(Bytes(*store->Get("jobs/j/1/rank-00000/w")), a);
  EXPECT_EQ(store->used_bytes(), 8u);
  // Nothing stray in the shared-memory directory either.
  EXPECT_TRUE(fs::is_empty(store->shm_dir() + "/tmp"));
}

TEST(StoreTest, ListResolvesCurrentAndSortsByVersion) {
  auto store = OpenStore();
  uint8_t x = 0;
  for (uint64_t v : {9, 10}) {
    ASSERT_TRUE(store->BeginVersion("j", v).ok());
    for (const char* n : {"rank-00001/b", "rank-00000/a", "rank-00000/b"}) {
      ASSERT_TRUE(store->Put("jobs/j/" + std::to_string(v) + "/" + n, DType::kU8, {1}, &x, 1).ok());
    }
    if (v == 9) {
      ASSERT_TRUE(store->Commit("j", 9, /*keep_old=*/true).ok());
    }
  }
  ASSERT_TRUE(store->BeginVersion("k").ok());
  ASSERT_TRUE(store->Put("jobs/k/1/rank-00000/a", DType::kU8, {1}, &x, 1).ok());
  auto paths = [&](const std::string& prefix) {
    std::vector<std::string> out;
    auto list = store->List(prefix);
    EXPECT_TRUE(list.ok()) << prefix;
    if (list.ok()) {
      for (const TensorInfo& t : *list) out.push_back(t.path);
    }
    return out;
  };
  EXPECT_EQ(paths("jobs/j/current/"),
            (std::vector<std::string>{"jobs/j/9/rank-00000/a", "jobs/j/9/rank-00000/b",
                                      "jobs/j/9/rank-00001/b"}));
  EXPECT_EQ(paths("jobs/j/current/rank-00000/b"),
            (std::vector<std::string>{"jobs/j/9/rank-00000/b"}));
  EXPECT_EQ(paths("jobs/j/1").size(), 3u);  // version 10
  EXPECT_EQ(paths("jobs/j/").size(), 6u);
  EXPECT_EQ(paths("jobs/j/")[0], "jobs/j/9/rank-00000/a");
  EXPECT_EQ(paths("jobs/j/")[3], "jobs/j/10/rank-00000/a");
  EXPECT_EQ(paths("jobs/").size(), 7u);
  EXPECT_EQ(paths("").size(), 7u);
  EXPECT_EQ(paths("jobs/k/current/").size(), 0u);
  EXPECT_EQ(paths("jobs/nope/").size(), 0u);
  EXPECT_FALSE(store->List("jobs/../").ok());
}

TEST(StoreTest, ChecksumIsXxh64OfTheBytes) {
  auto store = OpenStore();
  ASSERT_TRUE(store->BeginVersion("j").ok());
  auto a = RandomBytes(4096 + 5, 9);
  ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/w", DType::kU8, {4101}, a.data(), a.size()).ok());
  EXPECT_EQ(*store->Checksum("jobs/j/1/rank-00000/w"), Xxh64Hex(a.data(), a.size()));
  ASSERT_TRUE(store->Commit("j", 1).ok());
  EXPECT_EQ(*store->Checksum("jobs/j/current/rank-00000/w"), Xxh64Hex(a.data(), a.size()));
  EXPECT_EQ(*store->Checksum("jobs/j/current/rank-00000/w"),
            Xxh64Hex(a.data(), a.size()));  // cached
}

TEST(StoreTest, PrivateDirectoriesNeverCollideAndAreRemoved) {
  std::string d1, d2;
  {
    auto s1 = OpenStore();
    auto s2 = OpenStore();
    d1 = s1->shm_dir();
    d2 = s2->shm_dir();
    EXPECT_NE(d1, d2);
    EXPECT_NE(s1->id(), s2->id());
    EXPECT_TRUE(fs::is_directory(d1));
    EXPECT_EQ(*ReadFile(d1 + "/STORE_ID"), s1->id() + "\n");
  }
  EXPECT_FALSE(fs::exists(d1));
  EXPECT_FALSE(fs::exists(d2));
}

TEST(StoreTest, RestartKeepsCommittedStateOnly) {
  TempDir dir;
  auto a = RandomBytes(64, 5), b = RandomBytes(32, 6);
  {
    auto store = OpenStore({.shm_dir = dir.path});
    // A second store on the same directory is refused.
    auto second = Store::Open({.shm_dir = dir.path});
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
    ASSERT_TRUE(store->BeginVersion("j", std::nullopt, R"({"config": "tp=2"})").ok());
    ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/a", DType::kF32, {4, 4}, a.data(), a.size()).ok());
    ASSERT_TRUE(store->Put("jobs/j/1/rank-00001/b", DType::kBF16, {16}, b.data(), b.size()).ok());
    ASSERT_TRUE(store->Put("jobs/j/1/rank-00001/s", DType::kI64, {}, a.data(), 8).ok());
    ASSERT_TRUE(store->Put("jobs/j/1/rank-00001/e", DType::kF32, {0, 3}, nullptr, 0).ok());
    ASSERT_TRUE(store->Commit("j", 1).ok());
    ASSERT_TRUE(store->BeginVersion("j").ok());  // open at shutdown: dropped
    ASSERT_TRUE(store->Put("jobs/j/2/rank-00000/a", DType::kF32, {8}, b.data(), 32).ok());
    ASSERT_TRUE(store->BeginVersion("never").ok());  // a job without a committed version
  }
  // A crashed commit: a newer version with a manifest but CURRENT not yet moved.
  fs::create_directories(dir.path + "/jobs/j/7/rank-00000");
  ASSERT_TRUE(WriteFileAtomic(dir.path + "/jobs/j/7/MANIFEST.json", "{}").ok());
  ASSERT_TRUE(WriteFileAtomic(dir.path + "/jobs/j/7/rank-00000/a", "xxxx").ok());
  ASSERT_TRUE(WriteFileAtomic(dir.path + "/tmp/123", "partial").ok());
  {
    auto store = OpenStore({.shm_dir = dir.path});
    EXPECT_EQ(store->Jobs(), std::vector<std::string>{"j"});
    auto job = store->Job("j");
    ASSERT_TRUE(job.ok());
    ASSERT_EQ(job->versions.size(), 1u);
    EXPECT_EQ(job->current, 1u);
    EXPECT_EQ(job->versions[0].info, R"({"config":"tp=2"})");
    EXPECT_EQ(Bytes(*store->Get("jobs/j/current/rank-00000/a")), a);
    EXPECT_EQ(Bytes(*store->Get("jobs/j/current/rank-00001/b")), b);
    auto s = store->Get("jobs/j/current/rank-00001/s");
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->info().shape, Shape{});
    EXPECT_EQ(s->info().dtype, DType::kI64);
    EXPECT_EQ(std::memcmp(s->data(), a.data(), 8), 0);
    auto e = store->Meta("jobs/j/current/rank-00001/e");
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->shape, (Shape{0, 3}));
    EXPECT_EQ(store->used_bytes(), 64u + 32u + 8u);
    EXPECT_FALSE(fs::exists(dir.path + "/jobs/j/7"));
    EXPECT_FALSE(fs::exists(dir.path + "/jobs/j/2"));
    EXPECT_TRUE(fs::is_empty(dir.path + "/tmp"));
    // Committed state stays immutable after the restart; new versions continue.
    EXPECT_EQ(
        store->Put("jobs/j/1/rank-00000/a", DType::kF32, {4, 4}, b.data(), 64).status().code(),
        StatusCode::kFailedPrecondition);
    EXPECT_EQ(*store->BeginVersion("j"), 2u);
  }
  // A committed tensor file removed behind the store's back: the job is quarantined
  // (QuarantineTest), the store still opens.
  fs::remove(dir.path + "/jobs/j/1/rank-00000/a");
  auto broken = Store::Open({.shm_dir = dir.path});
  ASSERT_TRUE(broken.ok()) << broken.status().ToString();
  EXPECT_EQ((*broken)->Job("j").status().code(), StatusCode::kDataLoss);
}

// One job with unreadable files (issue 19: a corrupt manifest stopped the daemon) is
// moved aside and refused with the reason; the others are served; the quarantine is
// reported after another restart; DeleteJob forgets it and frees the name.
TEST(StoreTest, CorruptJobIsQuarantined) {
  TempDir dir;
  auto a = RandomBytes(64, 11), b = RandomBytes(32, 12);
  {
    auto store = OpenStore({.shm_dir = dir.path});
    for (const char* job : {"good", "bad", "gone", "cur"}) {
      ASSERT_TRUE(store->BeginVersion(job).ok());
      ASSERT_TRUE(
          store
              ->Put(std::string("jobs/") + job + "/1/rank-00000/a", DType::kF32, {16}, a.data(), 64)
              .ok());
      ASSERT_TRUE(store->Commit(job, 1).ok());
    }
  }
  const std::string manifest = dir.path + "/jobs/bad/1/MANIFEST.json";
  const std::string text = *ReadFile(manifest);
  ASSERT_TRUE(WriteFileAtomic(manifest, text.substr(0, text.size() / 2)).ok());  // truncated
  fs::remove(dir.path + "/jobs/gone/1/rank-00000/a");
  ASSERT_TRUE(WriteFileAtomic(dir.path + "/jobs/cur/CURRENT", "seven\n").ok());
  {
    auto store = OpenStore({.shm_dir = dir.path});
    EXPECT_EQ(store->Jobs(), std::vector<std::string>{"good"});
    EXPECT_EQ(Bytes(*store->Get("jobs/good/current/rank-00000/a")), a);
    EXPECT_EQ(store->used_bytes(), 64u);  // the quarantined jobs' bytes are not counted
    auto q = store->QuarantinedJobs();
    ASSERT_EQ(q.size(), 3u);
    EXPECT_EQ(q[0].job, "bad");
    EXPECT_NE(q[0].reason.find("MANIFEST.json"), std::string::npos) << q[0].reason;
    EXPECT_EQ(q[1].job, "cur");
    EXPECT_NE(q[1].reason.find("CURRENT"), std::string::npos) << q[1].reason;
    EXPECT_EQ(q[2].job, "gone");
    EXPECT_NE(q[2].reason.find("missing"), std::string::npos) << q[2].reason;
    EXPECT_TRUE(fs::exists(q[0].path + "/1/rank-00000/a"));  // moved aside, not deleted
    EXPECT_FALSE(fs::exists(dir.path + "/jobs/bad"));
    for (const char* path : {"jobs/bad/1/rank-00000/a", "jobs/bad/current/rank-00000/a"}) {
      auto r = store->Get(path);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
      EXPECT_NE(r.status().message().find("quarantined"), std::string::npos);
    }
    EXPECT_EQ(store->BeginVersion("bad").status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(store->List("jobs/bad/").status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(store->List("jobs/").value().size(), 1u);  // good's one tensor
    EXPECT_EQ(store->Job("gone").status().code(), StatusCode::kDataLoss);
    ASSERT_TRUE(store->DeleteJob("gone").ok());
    EXPECT_EQ(store->Job("gone").status().code(), StatusCode::kNotFound);
  }
  {
    auto store = OpenStore({.shm_dir = dir.path});
    auto q = store->QuarantinedJobs();
    ASSERT_EQ(q.size(), 2u);  // still reported; "gone" was deleted
    EXPECT_EQ(q[0].job, "bad");
    EXPECT_EQ(q[1].job, "cur");
    ASSERT_TRUE(store->DeleteJob("bad").ok());
    ASSERT_TRUE(store->DeleteJob("cur").ok());
    EXPECT_TRUE(fs::is_empty(dir.path + "/quarantine"));
    ASSERT_TRUE(store->BeginVersion("bad").ok());  // the name is free again
    ASSERT_TRUE(store->Put("jobs/bad/1/rank-00000/a", DType::kF32, {8}, b.data(), 32).ok());
    ASSERT_TRUE(store->Commit("bad", 1).ok());
  }
  auto store = OpenStore({.shm_dir = dir.path});
  EXPECT_TRUE(store->QuarantinedJobs().empty());
  EXPECT_EQ(Bytes(*store->Get("jobs/bad/current/rank-00000/a")), b);
}

// Checksums recorded at prepare/commit (issue 19): kept in the manifest across a
// restart, equal to xxh64 of the bytes; a byte flipped in a committed tensor's file is
// DataLoss from Checksum (never a stale cached value); open versions have none.
TEST(StoreTest, ChecksumsAreRecordedAndChecked) {
  TempDir dir;
  auto a = RandomBytes(4096, 21), b = RandomBytes(32, 22);
  std::string file;
  {
    auto store = OpenStore({.shm_dir = dir.path});
    ASSERT_TRUE(store->BeginVersion("j").ok());
    ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/a", DType::kU8, {4096}, a.data(), 4096).ok());
    ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/e", DType::kF32, {0}, nullptr, 0).ok());
    EXPECT_EQ(store->Meta("jobs/j/1/rank-00000/a")->xxh64, "");  // open: not yet
    ASSERT_TRUE(store->Commit("j", 1).ok());
    EXPECT_EQ(store->Meta("jobs/j/1/rank-00000/a")->xxh64, Xxh64Hex(a.data(), a.size()));
    EXPECT_EQ(store->Meta("jobs/j/1/rank-00000/e")->xxh64, Xxh64Hex(nullptr, 0));
    ASSERT_TRUE(store->BeginVersion("j", 2).ok());
    ASSERT_TRUE(store->Put("jobs/j/2/rank-00000/a", DType::kU8, {32}, b.data(), 32).ok());
    ASSERT_TRUE(store->Prepare("j", 2).ok());
    EXPECT_EQ(store->Meta("jobs/j/2/rank-00000/a")->xxh64, Xxh64Hex(b.data(), b.size()));
    file = store->Meta("jobs/j/1/rank-00000/a")->file;
  }
  EXPECT_NE(ReadFile(dir.path + "/jobs/j/1/MANIFEST.json")->find(Xxh64Hex(a.data(), a.size())),
            std::string::npos);
  auto store = OpenStore({.shm_dir = dir.path});
  EXPECT_EQ(store->Meta("jobs/j/1/rank-00000/a")->xxh64, Xxh64Hex(a.data(), a.size()));
  EXPECT_EQ(store->Meta("jobs/j/2/rank-00000/a")->xxh64, Xxh64Hex(b.data(), b.size()));
  EXPECT_EQ(*store->Checksum("jobs/j/1/rank-00000/a"), Xxh64Hex(a.data(), a.size()));
  // A bit flip behind the store's back.
  {
    std::FILE* f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, 1000, SEEK_SET);
    std::fputc(a[1000] ^ 0x04, f);
    std::fclose(f);
  }
  auto sum = store->Checksum("jobs/j/1/rank-00000/a");
  ASSERT_FALSE(sum.ok());
  EXPECT_EQ(sum.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(sum.status().message().find("jobs/j/1/rank-00000/a"), std::string::npos);
  EXPECT_NE(sum.status().message().find("corrupt"), std::string::npos);
}

// Phase one of a two-phase commit (issue 19): a prepared version is immutable and
// survives a restart (also a crash: the files are what counts), above the current
// version; it commits (again: idempotent) or aborts after the restart; an open
// version and a prepare without its marker do not survive.
TEST(StoreTest, PreparedVersionsSurviveARestart) {
  TempDir dir;
  auto a = RandomBytes(64, 7), b = RandomBytes(32, 8);
  {
    auto store = OpenStore({.shm_dir = dir.path});
    ASSERT_TRUE(store->BeginVersion("j", std::nullopt, R"({"config": "tp=1"})").ok());
    ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/a", DType::kF32, {16}, a.data(), 64).ok());
    ASSERT_TRUE(store->Commit("j", 1).ok());
    ASSERT_TRUE(store->BeginVersion("j", 2, R"({"config": "tp=2"})").ok());
    ASSERT_TRUE(store->Put("jobs/j/2/rank-00000/a", DType::kF32, {8}, b.data(), 32).ok());
    ASSERT_TRUE(store->Prepare("j", 2).ok());
    ASSERT_TRUE(store->Prepare("j", 2).ok());  // idempotent
    auto v2 = store->Version("j", 2);
    ASSERT_TRUE(v2.ok());
    EXPECT_TRUE(v2->prepared);
    EXPECT_FALSE(v2->committed);
    EXPECT_FALSE(v2->current);
    // Immutable from here on.
    EXPECT_EQ(store->Put("jobs/j/2/rank-00000/a", DType::kF32, {8}, a.data(), 32).status().code(),
              StatusCode::kFailedPrecondition);
    EXPECT_EQ(store->Delete("jobs/j/2/rank-00000/a").code(), StatusCode::kFailedPrecondition);
    // A first version that is only prepared (a load's phase one) keeps its job.
    ASSERT_TRUE(store->BeginVersion("fresh", 5).ok());
    ASSERT_TRUE(store->Put("jobs/fresh/5/rank-00000/x", DType::kU8, {4}, a.data(), 4).ok());
    ASSERT_TRUE(store->Prepare("fresh", 5).ok());
    // Fencing: no newer version begins while a prepared one awaits its decision.
    Result<uint64_t> v3 = store->BeginVersion("j", 3);
    EXPECT_EQ(v3.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(v3.status().message().find("version 2 is prepared"), std::string::npos)
        << v3.status().ToString();
    ASSERT_TRUE(store->BeginVersion("open", 1).ok());  // open: dropped at the restart
  }
  // A prepare that crashed between its manifest and its marker: not prepared.
  fs::create_directories(dir.path + "/jobs/j/9/rank-00000");
  ASSERT_TRUE(WriteFileAtomic(dir.path + "/jobs/j/9/rank-00000/a", "xxxx").ok());
  ASSERT_TRUE(WriteFileAtomic(dir.path + "/jobs/j/9/MANIFEST.json",
                              R"({"format": "tenplex.store.version.v1", "tensors": []})")
                  .ok());
  {
    auto store = OpenStore({.shm_dir = dir.path});
    auto job = store->Job("j");
    ASSERT_TRUE(job.ok());
    ASSERT_EQ(job->versions.size(), 2u);
    EXPECT_EQ(job->current, 1u);
    EXPECT_TRUE(job->versions[1].prepared);
    EXPECT_EQ(job->versions[1].info, R"({"config":"tp=2"})");
    EXPECT_FALSE(fs::exists(dir.path + "/jobs/j/3"));
    EXPECT_FALSE(fs::exists(dir.path + "/jobs/open"));
    EXPECT_FALSE(fs::exists(dir.path + "/jobs/j/9"));
    EXPECT_EQ(Bytes(*store->Get("jobs/j/2/rank-00000/a")), b);
    EXPECT_EQ(store->used_bytes(), 64u + 32u + 4u);
    auto fresh = store->Job("fresh");
    ASSERT_TRUE(fresh.ok());
    EXPECT_FALSE(fresh->current.has_value());
    ASSERT_EQ(fresh->versions.size(), 1u);
    EXPECT_TRUE(fresh->versions[0].prepared);
    // Commit with the old version kept, then again (a lost reply): no-op.
    ASSERT_TRUE(store->Commit("j", 2, /*keep_old=*/true).ok());
    ASSERT_TRUE(store->Commit("j", 2, /*keep_old=*/true).ok());
    EXPECT_EQ(Bytes(*store->Get("jobs/j/current/rank-00000/a")), b);
    EXPECT_EQ(Bytes(*store->Get("jobs/j/1/rank-00000/a")), a);  // kept until round two
    ASSERT_TRUE(store->ReleaseOld("j").ok());
    EXPECT_FALSE(store->Version("j", 1).ok());
    // A prepared version can be aborted (the decision was abort).
    ASSERT_TRUE(store->DropVersion("fresh", 5).ok());
    EXPECT_FALSE(store->Job("fresh").ok());
    EXPECT_FALSE(fs::exists(dir.path + "/jobs/j/2/PREPARED"));
  }
  {
    auto store = OpenStore({.shm_dir = dir.path});
    auto job = store->Job("j");
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->current, 2u);
    ASSERT_EQ(job->versions.size(), 1u);
    EXPECT_TRUE(job->versions[0].committed);
    EXPECT_FALSE(job->versions[0].prepared);
  }
}

TEST(StoreTest, ConcurrentWritersAndReaders) {
  auto store = OpenStore();
  ASSERT_TRUE(store->BeginVersion("j").ok());
  constexpr int kThreads = 4, kPer = 25;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPer; ++i) {
        auto data = RandomBytes(256 + i, t * 1000 + i);
        std::string path = "jobs/j/1/rank-0000" + std::to_string(t) + "/t" + std::to_string(i);
        if (!store
                 ->Put(path, DType::kU8, {static_cast<int64_t>(data.size())}, data.data(),
                       data.size())
                 .ok()) {
          ++failures;
        }
        auto got = store->Get(path);
        if (!got.ok() || Bytes(*got) != data) ++failures;
        (void)store->List("jobs/j/1/");
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(store->Commit("j", 1).ok());
  EXPECT_EQ(store->List("jobs/j/current/").value().size(),
            static_cast<std::size_t>(kThreads * kPer));
}

// A map knows whether its page tables are filled: mapped with populate, or after a
// pre-fault; a pre-fault of a populated map (a pooled file's kept map handed to a new
// tensor) does nothing, and the map moves with the flag. The bytes are the file's.
TEST(ShmMappingTest, PopulatedMapsAreNotPrefaultedAgain) {
  TempDir dir;
  fs::create_directories(dir.path);
  const std::string file = dir.path + "/t";
  ASSERT_TRUE(CreateShmFile(file, 1 << 20, /*allocate=*/true).ok());
  Result<ShmMapping> lazy = ShmMapping::Map(file, 0, 1 << 20, /*writable=*/true);
  ASSERT_TRUE(lazy.ok()) << lazy.status().ToString();
  EXPECT_FALSE(lazy->populated());
  lazy->Prefault();
#ifdef MADV_POPULATE_WRITE
  // Linux >= 5.14 has it; older kernels refuse it (EINVAL) and the flag stays false.
  if (::madvise(lazy->data(), 4096, MADV_POPULATE_WRITE) == 0) {
    EXPECT_TRUE(lazy->populated());
  }
#endif
  Result<ShmMapping> eager =
      ShmMapping::Map(file, 0, 1 << 20, /*writable=*/true, /*populate=*/true);
  ASSERT_TRUE(eager.ok());
  EXPECT_TRUE(eager->populated());
  std::memset(eager->data(), 0x5a, 1 << 20);
  ShmMapping moved = std::move(eager).value();
  EXPECT_TRUE(moved.populated());
  moved.Prefault();  // a no-op: the bytes stay
  moved.Shrink(4096);
  EXPECT_TRUE(moved.populated());
  for (uint64_t i = 0; i < (1 << 20); i += 4093) ASSERT_EQ(lazy->data()[i], 0x5a) << i;
}

}  // namespace
}  // namespace tenplex::store
