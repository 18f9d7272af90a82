#include "tenplex/store/store.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "tenplex/store/mapping.h"
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
