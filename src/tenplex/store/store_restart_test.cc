// The store across restarts of its daemon: private directories, committed state kept
// and open state dropped, a corrupt job quarantined, checksums recorded and checked, and
// prepared versions (phase one of a two-phase commit) surviving.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "tenplex/store/store.h"
#include "tenplex/store/store_testing.h"
#include "tenplex/util/file.h"
#include "tenplex/util/hash.h"

namespace tenplex::store {
namespace {

namespace fs = std::filesystem;
using testing::Bytes;
using testing::OpenStore;
using testing::RandomBytes;
using testing::TempDir;

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

}  // namespace
}  // namespace tenplex::store
