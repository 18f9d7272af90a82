// Links swapped into a running store's directory (issue 35): a job directory, a version
// or rank directory or a tensor file replaced by a symbolic link while the store serves
// must never make it read or write outside its directory (an /etc/shadow-like target
// stays unread and unchanged); the store refuses with an error that says so, and goes
// on serving its other jobs. INCARNATION and CLOSED replaced by links are never
// followed either (the store keeps them in memory and replaces, not writes through, the
// files). The store here is reopened after the jobs are written, so that its tensors are
// read through their files (as after a daemon's restart), not through its own maps.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tenplex/store/store.h"

namespace tenplex::store {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  std::string path = "/tmp/tenplex-links-" + std::to_string(::getpid()) + "-" +
                     std::to_string(std::random_device()());
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

std::string Slurp(const std::string& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A "secret" outside the store, as long as a tensor (so a size check cannot save us).
std::string PlantSecret(const std::string& dir, const std::string& name) {
  const std::string file = dir + "/" + name;
  std::ofstream(file) << std::string(64, 'S');
  ::chmod(file.c_str(), 0600);
  return file;
}

class StoreLinks : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<uint8_t> bytes(64, 7);
    {
      auto s = Store::Open({.shm_dir = dir.path + "/shm"});
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      for (const char* job : {"a", "b"}) {
        ASSERT_TRUE((*s)->BeginVersion(job).ok());
        auto put = (*s)->Put(std::string("jobs/") + job + "/1/rank-00000/x", DType::kF32, {16},
                             bytes.data(), 64);
        ASSERT_TRUE(put.ok()) << put.status().ToString();
        ASSERT_TRUE((*s)->Commit(job, 1).ok());
      }
    }
    auto s = Store::Open({.shm_dir = dir.path + "/shm"});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store = std::move(s).value();
    jobs = dir.path + "/shm/jobs/";
  }

  // b is served all along, whatever happens to a.
  void ExpectBServed() {
    auto ref = store->Get("jobs/b/current/rank-00000/x");
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    EXPECT_EQ(ref->data()[0], 7);
  }

  TempDir dir, outside;
  std::unique_ptr<Store> store;
  std::string jobs;
};

TEST_F(StoreLinks, JobDirectoryReplacedByALinkIsRefusedWhileServing) {
  // The attacker's copy of job a outside the store, its tensor a link to a secret.
  fs::create_directories(outside.path + "/a/1/rank-00000");
  const std::string secret = PlantSecret(outside.path, "shadow");
  fs::create_symlink(secret, outside.path + "/a/1/rank-00000/x");
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> served{0}, secret_read{0};
  std::thread reader([&] {  // a client reading both jobs throughout the swap
    while (!stop) {
      for (const char* path : {"jobs/a/1/rank-00000/x", "jobs/b/1/rank-00000/x"}) {
        auto ref = store->Get(path);
        if (!ref.ok()) continue;
        ++served;
        if (ref->data()[0] == 'S') ++secret_read;
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  fs::rename(jobs + "a", dir.path + "/shm/a-moved");  // (inside the store's directory)
  fs::create_directory_symlink(outside.path + "/a", jobs + "a");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop = true;
  reader.join();
  EXPECT_GT(served.load(), 0u);
  EXPECT_EQ(secret_read.load(), 0u);

  auto get = store->Get("jobs/a/1/rank-00000/x");
  ASSERT_FALSE(get.ok());
  EXPECT_EQ(get.status().code(), StatusCode::kDataLoss) << get.status().ToString();
  EXPECT_NE(get.status().message().find("replaced by a symbolic link to " + outside.path),
            std::string::npos)
      << get.status().ToString();
  EXPECT_NE(get.status().message().find("never follows"), std::string::npos);
  EXPECT_FALSE(store->Job("a").ok());
  EXPECT_FALSE(store->Meta("jobs/a/1/rank-00000/x").ok());
  EXPECT_FALSE(store->Checksum("jobs/a/1/rank-00000/x").ok());
  EXPECT_FALSE(store->BeginVersion("a").ok());
  EXPECT_FALSE(store->CloseTransforms("a", 5).ok());
  EXPECT_FALSE(store->ReleaseOld("a").ok());
  const std::vector<uint8_t> bytes(64, 9);
  EXPECT_FALSE(store->Put("jobs/a/2/rank-00000/y", DType::kF32, {16}, bytes.data(), 64).ok());
  ExpectBServed();
  // Nothing was written through the link: the outside tree is as planted.
  std::vector<std::string> there;
  for (const auto& e : fs::recursive_directory_iterator(outside.path)) {
    there.push_back(e.path().string().substr(outside.path.size() + 1));  // (links unresolved)
  }
  std::sort(there.begin(), there.end());
  EXPECT_EQ(there,
            (std::vector<std::string>{"a", "a/1", "a/1/rank-00000", "a/1/rank-00000/x", "shadow"}));
  EXPECT_EQ(Slurp(secret), std::string(64, 'S'));
  // Deleting the job removes the link, never what it points to; the name is free again.
  ASSERT_TRUE(store->DeleteJob("a").ok());
  EXPECT_FALSE(fs::exists(jobs + "a"));
  EXPECT_TRUE(fs::exists(outside.path + "/a/1/rank-00000"));
  ASSERT_TRUE(store->BeginVersion("a").ok());
  ASSERT_TRUE(store->Put("jobs/a/1/rank-00000/y", DType::kF32, {16}, bytes.data(), 64).ok());
  ASSERT_TRUE(store->Commit("a", 1).ok());
  EXPECT_TRUE(fs::is_directory(jobs + "a") && !fs::is_symlink(jobs + "a"));
  EXPECT_FALSE(fs::exists(outside.path + "/a/1/rank-00000/y"));
}

TEST_F(StoreLinks, JobDirectoryReplacedByAnotherJobsIsRefused) {
  // Aliasing (finding 5, now while the store runs): a becomes b's directory.
  fs::rename(jobs + "a", dir.path + "/shm/a-moved");
  fs::create_directory_symlink(jobs + "b", jobs + "a");
  EXPECT_FALSE(store->Get("jobs/a/1/rank-00000/x").ok());
  EXPECT_FALSE(store->BeginVersion("a", 2).ok());
  EXPECT_FALSE(fs::exists(jobs + "b/2"));
  // A real directory swapped in (not a link) is refused too: not the one the store made.
  fs::remove(jobs + "a");
  fs::create_directory(jobs + "a");
  auto info = store->Job("a");
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("replaced by another directory"), std::string::npos)
      << info.status().ToString();
  ExpectBServed();
}

TEST_F(StoreLinks, VersionRankAndTensorLinksAreNotFollowed) {
  const std::string secret = PlantSecret(outside.path, "shadow");
  // b's tensor file becomes a link to the secret.
  fs::remove(jobs + "b/1/rank-00000/x");
  fs::create_symlink(secret, jobs + "b/1/rank-00000/x");
  auto get = store->Get("jobs/b/1/rank-00000/x");
  ASSERT_FALSE(get.ok());
  EXPECT_EQ(get.status().code(), StatusCode::kFailedPrecondition) << get.status().ToString();
  EXPECT_NE(get.status().message().find("symbolic link"), std::string::npos);
  // a's version directory becomes a link to a directory outside.
  fs::create_directories(outside.path + "/v/rank-00000");
  fs::create_symlink(secret, outside.path + "/v/rank-00000/x");
  fs::rename(jobs + "a/1", jobs + "a/1-moved");
  fs::create_directory_symlink(outside.path + "/v", jobs + "a/1");
  EXPECT_FALSE(store->Get("jobs/a/1/rank-00000/x").ok());
  EXPECT_FALSE(store->Checksum("jobs/a/1/rank-00000/x").ok());
  // An open version's rank directory swapped for a link: a new tensor is not published
  // through it, nor is a linked one.
  ASSERT_TRUE(store->BeginVersion("a", 2).ok());
  const std::vector<uint8_t> bytes(64, 9);
  ASSERT_TRUE(store->Put("jobs/a/2/rank-00000/y", DType::kF32, {16}, bytes.data(), 64).ok());
  fs::rename(jobs + "a/2/rank-00000", jobs + "a/2/rank-moved");
  fs::create_directory_symlink(outside.path + "/v/rank-00000", jobs + "a/2/rank-00000");
  auto put = store->Put("jobs/a/2/rank-00000/z", DType::kF32, {16}, bytes.data(), 64);
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.status().message().find("symbolic link"), std::string::npos)
      << put.status().ToString();
  EXPECT_FALSE(fs::exists(outside.path + "/v/rank-00000/z"));
  EXPECT_FALSE(store->Prepare("a", 2).ok() && fs::exists(outside.path + "/v/MANIFEST.json"));
  EXPECT_EQ(Slurp(secret), std::string(64, 'S'));
}

TEST_F(StoreLinks, TensorFileReplacedByAFifoFailsAtOnce) {
  fs::remove(jobs + "b/1/rank-00000/x");
  ASSERT_EQ(::mkfifo((jobs + "b/1/rank-00000/x").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto get = store->Get("jobs/b/1/rank-00000/x");  // (a blocking open would hang here)
  EXPECT_FALSE(get.ok());
  EXPECT_NE(get.status().message().find("not a regular file"), std::string::npos)
      << get.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// A commit hashes the tensors it has no map of by reading their files (Xxh64Beneath): a
// file cut short before the commit fails it with DataLoss, one replaced by a FIFO fails it
// at once, one replaced by a link is refused; the job stays at version 1 each time.
TEST_F(StoreLinks, TensorFileSwappedBeforeItsCommitFailsTheCommit) {
  const std::vector<uint8_t> bytes(64, 5);
  const std::string file = jobs + "a/2/rank-00000/x";
  auto expect_refused = [&](const char* needle) {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = store->Commit("a", 2);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
    auto job = store->Job("a");
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->current, std::optional<uint64_t>(1));
  };
  ASSERT_TRUE(store->BeginVersion("a", 2).ok());
  ASSERT_TRUE(store->Put("jobs/a/2/rank-00000/x", DType::kF32, {16}, bytes.data(), 64).ok());
  ASSERT_TRUE(fs::exists(file));
  fs::resize_file(file, 60);
  expect_refused("expected 64");
  fs::remove(file);
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0);
  expect_refused("not a regular file");
  fs::remove(file);
  fs::create_symlink(PlantSecret(outside.path, "x"), file);
  expect_refused("symbolic link");
}

TEST_F(StoreLinks, IncarnationAndClosedLinksAreReplacedNeverWrittenThrough) {
  auto before = store->Job("a");
  ASSERT_TRUE(before.ok());
  const std::string inc_target = PlantSecret(outside.path, "inc");
  const std::string closed_target = PlantSecret(outside.path, "closed");
  fs::remove(jobs + "a/INCARNATION");
  fs::create_symlink(inc_target, jobs + "a/INCARNATION");
  fs::create_symlink(closed_target, jobs + "a/CLOSED");
  auto now = store->Job("a");
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ(now->incarnation, before->incarnation);  // kept in memory, not re-read
  ASSERT_TRUE(store->CloseTransforms("a", 5).ok());
  EXPECT_FALSE(fs::is_symlink(jobs + "a/CLOSED"));  // the link replaced by the new file
  EXPECT_EQ(Slurp(jobs + "a/CLOSED"), "5\n");
  EXPECT_EQ(Slurp(closed_target), std::string(64, 'S'));
  EXPECT_EQ(Slurp(inc_target), std::string(64, 'S'));
  EXPECT_EQ(store->Job("a")->closed, 5u);
  // After a restart the INCARNATION link is not read (a new incarnation is made).
  store.reset();
  auto again = Store::Open({.shm_dir = dir.path + "/shm"});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto after = (*again)->Job("a");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_NE(after->incarnation, std::string(64, 'S').substr(0, 16));
  EXPECT_EQ(Slurp(inc_target), std::string(64, 'S'));
}

}  // namespace
}  // namespace tenplex::store
