// ReadJobListing (job_listing.h) against the full listings: every host's versions and
// states, each distinct info fetched once and equal to the info its hosts serve, equal
// infos sharing an index, a host without the job, a lost host; and the daemon's
// GET /v1/jobs/J?info=digest (the xxh64 of the served info, no info; bad values 400).
#include "tenplex/cluster/job_listing.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "tenplex/store/server.h"
#include "tenplex/util/hash.h"

namespace tenplex::cluster {
namespace {

using nlohmann::json;

struct Daemon {
  std::unique_ptr<store::Store> store = std::move(store::Store::Open({})).value();
  std::unique_ptr<store::Server> server =
      std::make_unique<store::Server>(*store, store::ServerOptions{});
  std::thread thread;
  int port = 0;
  std::unique_ptr<store::Client> client;
  Daemon() {
    port = *server->Bind("127.0.0.1", 0);
    thread = std::thread([this] { (void)server->Serve(); });
    client = std::move(store::Client::Connect("http://127.0.0.1:" + std::to_string(port))).value();
  }
  ~Daemon() {
    server->Stop();
    thread.join();
  }
};

std::string Info(const std::string& tag) {
  return json{{"tag", tag}, {"pad", std::string(2000, 'x')}}.dump();
}

TEST(JobListingTest, MatchesTheFullListingsWithEachInfoOnce) {
  std::vector<std::unique_ptr<Daemon>> d(4);
  for (auto& x : d) x = std::make_unique<Daemon>();
  // Hosts 0-2: version 1 committed (info A); hosts 0-1: version 2 prepared (info B);
  // host 2: version 3 open (info C); host 3: no job; a fifth, lost host (null).
  for (int h = 0; h < 3; ++h) {
    store::Store& s = *d[h]->store;
    ASSERT_TRUE(s.BeginVersion("j", 1, Info("A")).ok());
    ASSERT_TRUE(s.Commit("j", 1).ok());
  }
  // Host 1 had version 5, dropped (aborted): its number is not used again.
  ASSERT_TRUE(d[1]->store->BeginVersion("j", 5, Info("D")).ok());
  ASSERT_TRUE(d[1]->store->DropVersion("j", 5).ok());
  for (int h = 0; h < 2; ++h) {
    ASSERT_TRUE(d[h]->store->BeginVersion("j", 2, Info("B")).ok());
    ASSERT_TRUE(d[h]->store->Prepare("j", 2).ok());
  }
  ASSERT_TRUE(d[2]->store->BeginVersion("j", 3, Info("C")).ok());
  std::vector<store::Client*> clients;
  for (auto& x : d) clients.push_back(x->client.get());
  clients.push_back(nullptr);

  const JobListing l = ReadJobListing(clients, "j");
  ASSERT_EQ(l.hosts.size(), 5u);
  EXPECT_EQ(l.hosts[3].status.code(), StatusCode::kNotFound);
  EXPECT_EQ(l.hosts[4].status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(l.infos.size(), 3u);   // A, B, C once each
  EXPECT_EQ(l.NextVersion(), 6u);  // above the aborted 5, not only the listed 1-3
  EXPECT_EQ(l.hosts[1].last, 5u);
  EXPECT_EQ(l.hosts[0].last, 2u);
  for (int h = 0; h < 3; ++h) {
    ASSERT_TRUE(l.hosts[h].status.ok()) << l.hosts[h].status.ToString();
    Result<store::JobInfo> full = clients[h]->Job("j");  // the reference: infos in full
    ASSERT_TRUE(full.ok());
    EXPECT_EQ(l.hosts[h].current, full->current);
    ASSERT_EQ(l.hosts[h].versions.size(), full->versions.size());
    for (std::size_t i = 0; i < full->versions.size(); ++i) {
      const ListedVersion& lv = l.hosts[h].versions[i];
      const store::VersionInfo& fv = full->versions[i];
      EXPECT_EQ(lv.version, fv.version);
      EXPECT_EQ(lv.committed, fv.committed);
      EXPECT_EQ(lv.prepared, fv.prepared);
      ASSERT_GE(lv.info, 0);
      EXPECT_EQ(l.infos[lv.info], fv.info) << "host " << h << " version " << fv.version;
      EXPECT_EQ(l.Find(h, fv.version), &lv);
    }
  }
  EXPECT_EQ(l.Find(0, 1)->info, l.Find(2, 1)->info);  // equal infos, one index
  EXPECT_NE(l.Find(0, 1)->info, l.Find(0, 2)->info);
  EXPECT_EQ(l.Find(3, 1), nullptr);
}

TEST(JobListingTest, DaemonListsInfoDigests) {
  Daemon d;
  ASSERT_TRUE(d.store->BeginVersion("j", 1, Info("A")).ok());
  httplib::Client cli("127.0.0.1", d.port);
  auto full = cli.Get("/v1/jobs/j");
  auto digests = cli.Get("/v1/jobs/j?info=digest");
  ASSERT_TRUE(full && digests);
  ASSERT_EQ(digests->status, 200) << digests->body;
  const json f = json::parse(full->body)["versions"][0];
  const json g = json::parse(digests->body)["versions"][0];
  const std::string served = f["info"].dump();
  EXPECT_EQ(g["info_xxh64"], Xxh64Hex(served.data(), served.size()));
  EXPECT_FALSE(g.contains("info"));
  EXPECT_EQ(g["version"], 1);
  EXPECT_EQ(cli.Get("/v1/jobs/j?info=full")->status, 200);
  auto bad = cli.Get("/v1/jobs/j?info=nope");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("'info' must be 'full' or 'digest'"), std::string::npos) << bad->body;
}

}  // namespace
}  // namespace tenplex::cluster
