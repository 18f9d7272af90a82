// What lets coordinators of a job on several hosts agree (issue 34): the store's
// stable host id (finding 3), and the fencing of coordinators (finding 7; store.h
// BeginVersion, cluster/two_phase.h): a newer version's begin supersedes the older
// open ones, a late begin below an open version is refused, and a prepared version is
// never superseded (a newer begin waits for its decision).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "tenplex/store/store.h"
#include "tenplex/util/file.h"

namespace tenplex::store {
namespace {

namespace fs = std::filesystem;

// A fresh directory for a persistent store, removed at the end of the test.
struct TempDir {
  std::string path = "/dev/shm/tenplex-ids-" + std::to_string(::getpid()) + "-" +
                     std::to_string(std::random_device()());
  ~TempDir() { fs::remove_all(path); }
};

std::unique_ptr<Store> OpenStore(StoreOptions o = {}) {
  auto s = Store::Open(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

bool Says(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(StoreFenceTest, ANewerBeginSupersedesOpenVersions) {
  auto store = OpenStore();
  uint8_t x = 7;
  ASSERT_TRUE(store->BeginVersion("j", 1).ok());
  ASSERT_TRUE(store->Put("jobs/j/1/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_TRUE(store->Commit("j", 1).ok());
  ASSERT_TRUE(store->BeginVersion("j", 2).ok());  // coordinator A
  ASSERT_TRUE(store->Put("jobs/j/2/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_TRUE(store->BeginVersion("j", 3).ok());  // coordinator B, newer
  const std::string why = "version 2 of job 'j' was superseded by version 3 begun by another";
  Status put = store->Put("jobs/j/2/rank-00000/y", DType::kU8, {1}, &x, 1).status();
  EXPECT_EQ(put.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Says(put, why)) << put.ToString();
  Status prep = store->Prepare("j", 2);
  EXPECT_EQ(prep.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Says(prep, why)) << prep.ToString();
  Status commit = store->Commit("j", 2);
  EXPECT_EQ(commit.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Says(commit, why)) << commit.ToString();
  // A late begin below the open newer version loses too.
  Status late = store->BeginVersion("j", 2).status();  // (2 exists) and below 3
  EXPECT_FALSE(late.ok());
  ASSERT_TRUE(store->DropVersion("j", 2).ok());   // A aborts: allowed
  EXPECT_TRUE(Says(store->Commit("j", 2), why));  // and A still hears why
  late = store->BeginVersion("j", 2).status();
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Says(late, "version 3 was begun after it by another coordinator")) << late.ToString();
  // B goes on: prepare, commit; the job is at 3.  (See below for B aborting instead.)
  ASSERT_TRUE(store->Put("jobs/j/3/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_TRUE(store->Prepare("j", 3).ok());
  ASSERT_TRUE(store->Commit("j", 3).ok());
  EXPECT_EQ(store->Job("j")->current, 3u);
  EXPECT_EQ(store->Job("j")->versions.size(), 1u);
}

// The newer coordinator aborts (it lost elsewhere): the older one may go on here.
TEST(StoreFenceTest, AnAbortedVersionSupersedesNothing) {
  auto store = OpenStore();
  uint8_t x = 3;
  ASSERT_TRUE(store->BeginVersion("j", 2).ok());
  ASSERT_TRUE(store->BeginVersion("j", 3).ok());
  EXPECT_TRUE(Says(store->Prepare("j", 2), "superseded by version 3"));
  ASSERT_TRUE(store->DropVersion("j", 3).ok());
  ASSERT_TRUE(store->Put("jobs/j/2/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_TRUE(store->Prepare("j", 2).ok());
  ASSERT_TRUE(store->Commit("j", 2).ok());
  EXPECT_EQ(store->Job("j")->current, 2u);
}

TEST(StoreFenceTest, APreparedVersionIsNeverSuperseded) {
  auto store = OpenStore();
  uint8_t x = 1;
  ASSERT_TRUE(store->BeginVersion("j", 2).ok());
  ASSERT_TRUE(store->Put("jobs/j/2/rank-00000/x", DType::kU8, {1}, &x, 1).ok());
  ASSERT_TRUE(store->Prepare("j", 2).ok());
  Status b = store->BeginVersion("j", 3).status();
  EXPECT_EQ(b.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Says(b, "version 2 is prepared here and awaits its coordinator's decision"))
      << b.ToString();
  EXPECT_EQ(store->BeginVersion("j").status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->Commit("j", 2).ok());  // its decision stands
  EXPECT_EQ(*store->BeginVersion("j", 3), 3u);
  // Aborted instead: the next begin goes ahead too.
  ASSERT_TRUE(store->Prepare("j", 3).ok());
  EXPECT_FALSE(store->BeginVersion("j", 4).ok());
  ASSERT_TRUE(store->DropVersion("j", 3).ok());
  EXPECT_EQ(*store->BeginVersion("j", 4), 4u);
}

// Issue 34 finding 3: the host id is the store's stable identity: kept in
// <dir>/HOST_ID across restarts on the same directory (STORE_ID changes on purpose),
// different for another directory, and a corrupt file is refused with its path.
TEST(StoreTest, HostIdIsKeptAcrossRestarts) {
  TempDir dir, other;
  std::string host, instance;
  {
    auto store = OpenStore({.shm_dir = dir.path});
    host = store->host_id();
    instance = store->id();
    EXPECT_GE(host.size(), 16u);
    EXPECT_EQ(*ReadFile(dir.path + "/HOST_ID"), host + "\n");
  }
  {
    auto store = OpenStore({.shm_dir = dir.path});
    EXPECT_EQ(store->host_id(), host);
    EXPECT_NE(store->id(), instance);
    EXPECT_NE(OpenStore({.shm_dir = other.path})->host_id(), host);
  }
  ASSERT_TRUE(WriteFileAtomic(dir.path + "/HOST_ID", "not hex\n").ok());
  auto bad = Store::Open({.shm_dir = dir.path});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find(dir.path + "/HOST_ID"), std::string::npos);
}

}  // namespace
}  // namespace tenplex::store
