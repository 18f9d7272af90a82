// A hostile data-plane client for the fault campaign (issue 35,
// scripts/fault_campaign_hostile.py): connects to a daemon's UCX address with greedy
// flow control (no client-side bound on request size or bytes in flight) and fetches
// the probe region (kProbeRegion) the way an attacker would, counting what it gets.
//
//   tenplex_hostile_client --address A [--mode flood|oversize|batch] [--threads T]
//       [--runs N] [--run-bytes B] [--seconds S] [--capability probe|none|forged]
//       [--seed X] [--region NAME]
//
//  - flood: T threads, each fetching one request of N overlapping runs of B bytes at
//    random offsets at a time, until S seconds have passed (in-window requests, many
//    of them at once: answers in flight beyond the server's window are refused).
//  - oversize: one request of N runs of the whole region (N x 64 MiB, far over any
//    request bound) per Fetch, T threads, for S seconds.
//  - batch: one Fetch of T requests of N runs of B bytes each (all in flight together).
// capability: probe (minted with TENPLEX_TOKEN as the key, as the daemon does), none,
// forged (minted under a wrong key), a capability's text (tpc...: replayed; with
// --region a tensor's store path, read from its start), or mint:JOB:V:W:INCARNATION
// (a tensor capability for the transform V -> W of that incarnation of JOB, minted with
// TENPLEX_TOKEN for 10 minutes, as a participant's prepare does: what a peer that
// captured one would replay). Destinations are reserved, not committed,
// memory (MAP_NORESERVE): only what the server really sends is touched.
//
// Prints one JSON line per second and one at the end: {"final": bool, "fetches": n,
// "codes": {"OK": n, "RESOURCE_EXHAUSTED": n, ...}, "wrong_bytes": n, "bytes": n}.
// Exit status 0 when it ran (whatever the server answered), 2 on bad arguments or when
// it could not connect.
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tenplex/transport/capability.h"
#include "tenplex/transport/transport.h"

namespace tp = tenplex::transport;

namespace {

struct Args {
  std::string address, mode = "flood", capability = "probe", region = std::string(tp::kProbeRegion);
  int threads = 8;
  uint64_t runs = 80, run_bytes = 200 << 10, seed = 1;
  double seconds = 5;
};

struct Tally {
  std::mutex mu;
  std::map<std::string, uint64_t> codes;
  std::map<std::string, std::string> first;  // the first message of each code
  uint64_t fetches = 0, wrong = 0, bytes = 0;

  void Add(const tenplex::Status& s, uint64_t n, uint64_t wrong_bytes) {
    std::lock_guard<std::mutex> lock(mu);
    const std::string code(tenplex::StatusCodeName(s.code()));
    if (++codes[code] == 1 && !s.ok()) first[code] = s.message().substr(0, 200);
    ++fetches;
    wrong += wrong_bytes;
    if (s.ok()) bytes += n;
  }
  void Print(bool final) {
    std::lock_guard<std::mutex> lock(mu);
    std::string codes_json;
    for (const auto& [k, v] : codes) {
      codes_json += (codes_json.empty() ? "\"" : ", \"") + k + "\": " + std::to_string(v);
    }
    std::string first_json;
    for (const auto& [k, v] : first) {
      std::string m;  // JSON-safe: the message's printable ASCII, quotes and backslashes dropped
      for (char c : v) {
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') m += c;
      }
      first_json += (first_json.empty() ? "\"" : ", \"") + k + "\": \"" + m + "\"";
    }
    std::printf(
        "{\"final\": %s, \"fetches\": %llu, \"codes\": {%s}, \"wrong_bytes\": %llu, \"bytes\": "
        "%llu, \"messages\": {%s}}\n",
        final ? "true" : "false", static_cast<unsigned long long>(fetches), codes_json.c_str(),
        static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(bytes),
        first_json.c_str());
    std::fflush(stdout);
  }
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--address")
      a->address = v;
    else if (k == "--mode")
      a->mode = v;
    else if (k == "--capability")
      a->capability = v;
    else if (k == "--region")
      a->region = v;
    else if (k == "--threads")
      a->threads = std::atoi(v.c_str());
    else if (k == "--runs")
      a->runs = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--run-bytes")
      a->run_bytes = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--seconds")
      a->seconds = std::atof(v.c_str());
    else if (k == "--seed")
      a->seed = std::strtoull(v.c_str(), nullptr, 10);
    else
      return false;
  }
  const bool mode_ok = a->mode == "flood" || a->mode == "oversize" || a->mode == "batch";
  const bool cap_ok = a->capability == "probe" || a->capability == "none" ||
                      a->capability == "forged" || a->capability.rfind("tpc", 0) == 0 ||
                      a->capability.rfind("mint:", 0) == 0;
  return argc % 2 == 1 && !a->address.empty() && mode_ok && cap_ok && a->threads > 0 &&
         a->threads <= 256 && a->runs > 0 && a->runs <= 16384 && a->run_bytes > 0 &&
         a->run_bytes <= tp::kProbeRegionBytes;
}

// The capability of "JOB:V:W:INCARNATION" under `key`, living 10 minutes; nullopt when
// the text is malformed.
std::optional<std::string> MintFromSpec(const std::string& spec, const std::string& key) {
  std::vector<std::string> f;
  std::size_t at = 0;
  for (std::size_t c = spec.find(':'); c != std::string::npos; c = spec.find(':', at)) {
    f.push_back(spec.substr(at, c - at));
    at = c + 1;
  }
  f.push_back(spec.substr(at));
  if (f.size() != 4 || f[0].empty() || f[3].size() != 16) return std::nullopt;
  tp::CapabilityGrant g;
  g.job = f[0];
  char* end = nullptr;
  g.from_version = std::strtoull(f[1].c_str(), &end, 10);
  if (f[1].empty() || *end != '\0') return std::nullopt;
  g.to_version = std::strtoull(f[2].c_str(), &end, 10);
  if (f[2].empty() || *end != '\0') return std::nullopt;
  g.expires = tp::UnixSeconds() + 600;
  g.incarnation = f[3];
  return tp::MintCapability(key, g);
}

// Reserved address space for destinations; nullptr when even that is refused.
uint8_t* Reserve(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// Runs of `bytes` at random offsets of the probe region into dest, back to back.
// Another region (a replayed capability's tensor): runs from its start.
tp::ReadRequest RandomRequest(std::mt19937_64& rng, const Args& a, uint64_t bytes, uint8_t* dest,
                              const std::string& cap) {
  tp::ReadRequest r{a.region, {}, cap};
  const bool probe = a.region == tp::kProbeRegion;
  for (uint64_t i = 0; i < a.runs; ++i) {
    const uint64_t off = probe ? rng() % (tp::kProbeRegionBytes - bytes + 1) : 0;
    r.runs.push_back({off, bytes, dest + i * bytes});
  }
  return r;
}

// Bytes of a fetched request that differ from the probe pattern (one per run checked).
uint64_t WrongBytes(const tp::ReadRequest& r) {
  uint64_t wrong = 0;
  for (const tp::ReadRun& run : r.runs) {
    const auto* d = static_cast<const uint8_t*>(run.dest);
    for (uint64_t at : {uint64_t{0}, run.length / 2, run.length - 1}) {
      wrong += d[at] != tp::ProbeByte(run.offset + at);
    }
  }
  return wrong;
}

// Fetches until a.seconds have passed (or the peer is gone), tallying every Fetch.
int Flood(const Args& a, tp::Transport& transport, tp::PeerId peer, const std::string& cap) {
  const bool oversize = a.mode == "oversize";
  const uint64_t run_bytes = oversize ? tp::kProbeRegionBytes : a.run_bytes;
  const uint64_t per_request = a.runs * run_bytes;
  const int slots = a.mode == "batch" ? 1 : a.threads;
  const uint64_t per_slot = a.mode == "batch" ? per_request * a.threads : per_request;
  uint8_t* dest = Reserve(per_slot * slots);
  if (dest == nullptr) {
    std::fprintf(stderr, "error: cannot reserve %llu bytes of address space\n",
                 static_cast<unsigned long long>(per_slot * slots));
    return 2;
  }
  Tally tally;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(a.seconds);
  std::atomic<bool> done{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < slots; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(a.seed * 1000 + t);
      uint8_t* mine = dest + per_slot * t;
      do {
        std::vector<tp::ReadRequest> reqs;
        const int n = a.mode == "batch" ? a.threads : 1;
        for (int i = 0; i < n; ++i) {
          reqs.push_back(RandomRequest(rng, a, run_bytes, mine + per_request * i, cap));
        }
        tenplex::Status s = transport.Fetch(peer, reqs);
        uint64_t wrong = 0;
        if (s.ok() && !oversize && a.region == tp::kProbeRegion) {
          for (const auto& r : reqs) wrong += WrongBytes(r);
        }
        tally.Add(s, per_slot, wrong);
        if (s.code() == tenplex::StatusCode::kUnavailable) break;  // the daemon is gone
      } while (std::chrono::steady_clock::now() < end);
    });
  }
  std::thread reporter([&] {
    while (!done) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (!done) tally.Print(false);
    }
  });
  for (auto& w : workers) w.join();
  done = true;
  reporter.join();
  tally.Print(true);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(
        stderr,
        "usage: %s --address A [--mode flood|oversize|batch] [--threads T] [--runs N] "
        "[--run-bytes B] [--seconds S] [--capability probe|none|forged|tpc...|mint:J:V:W:I] "
        "[--seed X] [--region NAME]\n",
        argv[0]);
    return 2;
  }
  const char* token = std::getenv("TENPLEX_TOKEN");
  std::string cap;
  if (a.capability == "probe") cap = tp::MintProbeCapability(token ? token : "");
  if (a.capability == "forged") cap = tp::MintProbeCapability("not-the-token");
  if (a.capability.rfind("tpc", 0) == 0) cap = a.capability;  // replayed as it is
  if (a.capability.rfind("mint:", 0) == 0) {
    auto minted = MintFromSpec(a.capability.substr(5), token ? token : "");
    if (!minted) {
      std::fprintf(stderr, "error: --capability mint:JOB:V:W:INCARNATION, not '%s'\n",
                   a.capability.c_str());
      return 2;
    }
    cap = *minted;
  }
  // Greedy: no client-side flow control.
  tp::TransportOptions o;
  o.max_request_bytes = 1ull << 62;
  o.max_inflight_bytes = 1ull << 62;
  auto transport = tp::NewUcxTransport(nullptr, o);
  if (!transport.ok()) {
    std::fprintf(stderr, "error: %s\n", transport.status().ToString().c_str());
    return 2;
  }
  auto peer = (*transport)->Connect(a.address);
  if (!peer.ok()) {
    std::fprintf(stderr, "error: connect: %s\n", peer.status().ToString().c_str());
    return 2;
  }
  return Flood(a, **transport, *peer, cap);
}
