// The two-phase commit of a new version across the store daemons of a cluster, and the
// recovery that finishes or rolls back one that a crash left half done
// (docs/reliability.md, "2PC").
//
// Phase one: every participant writes its part of version v into an open version and
// makes it *prepared* (Store::Prepare: its manifest and a PREPARED marker are written,
// so a daemon restarted with the same --shm-dir keeps it; it is immutable from then
// on). Phase two: once every participant answered that it prepared, v is committed on
// every participant with keep_old (the old version stays); round two: once every
// participant confirmed its commit, the old versions are released there.
//
// The decision rule is a function of durable state only: v is committed iff every
// participant prepared it. A prepared version therefore always knows its outcome:
//  - some host has v committed: the decision was commit (roll forward);
//  - every participant (the hosts of v's info "cluster") has v prepared or committed:
//    commit (roll forward; nobody may abort a version every participant prepared);
//  - some live participant does not have v: abort (roll back). Only an *owner* of the
//    job (a coordinator: transform, load, recover) rolls back, since a coordinator that
//    is still collecting prepares would see the same picture; readers (save) only roll
//    forward.
//  - a participant does not answer, but the first participant (below) answers with v
//    prepared, not committed: abort. No host committed v (the first commits alone
//    first), and no coordinator can any more: an owner decides only under the job's
//    lease (job_lease.h), which fences every other coordinator's commit. Without this a
//    host lost for good in the commit window left v prepared on the others, refusing
//    every newer version until someone removed it by hand.
// Commits and aborts go to the participants in commit order, ascending stable host id
// (URL for a daemon without one), the same for every coordinator and resolver whatever
// the order of their host lists, and the first one alone first: its state is the
// decision record. A coordinator that finds the first participant committed when it
// wanted to abort rolls forward instead; a resolver that finds it aborted stops. So two
// deciders that race (a coordinator and a reader's roll forward) agree.
//
// Leases (store/lease.h, job_lease.h): every coordinator takes the job's lease on its
// hosts before its recovery and holds it until its decision is carried out, so the rule
// "a version some live participant lacks is rolled back", which would roll back a
// version another coordinator is still preparing, is applied by one coordinator at a
// time. Before leases two overlapping transforms split a job (docs/reliability.md).
//
// Fencing by version numbers (a second line behind the lease: a coordinator of an older
// build, or one stopped past its lease, whose requests race the next one), each host
// deciding locally (Store::BeginVersion):
//  - beginning w on a host supersedes every *open* version u < w there: Prepare(u),
//    Commit(u) and writes into u fail there with "version u of job J was superseded by
//    version w begun by another coordinator". u's coordinator cannot have decided yet
//    (that host has not prepared u, and now never will), so it loses before its
//    decision: it aborts u, and nothing of u was committed anywhere. If w is aborted
//    on that host instead (w's coordinator lost), u is no longer superseded there.
//  - a *prepared* version is never superseded: beginning w is refused while a prepared
//    u < w is on the host (its coordinator may have decided to commit; refusing its
//    commit on some hosts would split the job). w's coordinator loses before its
//    decision (nothing of w is prepared there); the recovery decides u (roll forward when
//    every participant prepared it), after which w may begin.
//  - beginning u is refused while an uncommitted w > u is on the host (u's coordinator
//    came late: it lost).
//  - a transform's begin names the version it is made from: refused on a host where a
//    newer one was committed meanwhile (its result would replace that commit unseen).
// So on every host the begins of the two versions are ordered: w's first means u never
// prepares there (u's coordinator loses); u's prepare first means w never begins there
// (w's coordinator loses). Where their participants overlap (a load and a transform of
// one cluster both place ranks on its first live host), at most one of the two reaches
// its decision; in rare interleavings across hosts both lose, each with its error, and
// a retry goes ahead. (With disjoint participants, e.g. a transform onto other hosts
// only, both may commit, and the newer number is the job's state.) The decision rule
// above is unchanged, and a version decided commit is never refused anywhere: nothing
// committed is lost. Recovery (ResolvePending) also aborts, with a log line, any open
// or prepared version older than a host's current version (left by a build without
// fencing, or a coordinator that died after losing): it can never be committed there,
// and a newer version is committed, so nothing is lost by removing it.
// A transform whose recovery leaves a version undecided (a participant does not
// answer) cannot begin a new version on hosts that hold it prepared until it is decided.
//
// Commit outcomes are idempotent and queryable: committing the current version again
// is a no-op, and a commit whose reply was lost is confirmed by asking the host for
// the version's state. A host that cannot be reached in phase two is *unconfirmed*:
// the decision (commit) stands, its prepared version survives its restart and is
// committed by the next operation on the job, and the old versions are kept until then.
//
// Open versions of a job that no coordinator is writing (one died) are removed by the
// next owner operation on the job.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tenplex/cluster/job_listing.h"
#include "tenplex/store/client.h"
#include "tenplex/util/status.h"

namespace tenplex::cluster {

struct CommitOutcome {
  std::vector<int> confirmed;    // participants that report v committed
  std::vector<int> unconfirmed;  // could not be reached: commit at their next recovery
  bool released = false;         // round two ran (every participant confirmed)
};

// Phase two and round two for version v of job on `participants` (indexes into
// clients; null clients are unreachable); round two (release) only when every one
// confirmed and `release` (false: other participants have not committed yet). DataLoss
// when a participant no longer has v (someone aborted it) or refuses the commit for
// another reason.
Result<CommitOutcome> CommitEverywhere(const std::vector<store::Client*>& clients,
                                       std::vector<int> participants, const std::string& job,
                                       uint64_t version, bool release = true);

// The whole protocol for a coordinator that wrote version v of job on every participant
// (an open version there; its info set): phase one's durable half (Store::Prepare on
// every participant at once), the decision, phase two and round two (CommitEverywhere;
// `release` as there). This is the one implementation that the runtime (tenplex run
// --cluster), the store's load and the Python binding (tenplex.elastic) call; the
// distributed transform's agents prepare as they copy and it decides with the same
// AbortEverywhere / CommitEverywhere.
//  - A participant that does not prepare: the decision is abort (AbortEverywhere, the
//    first host in commit order first) and the prepare's error is returned (with the
//    abort's, if that failed too). When the abort finds v committed on the first host
//    (a resolver rolled it forward: every participant had prepared after all), the
//    decision is commit.
//  - Every participant prepared: the decision is commit and stands. CommitEverywhere's
//    DataLoss (a host refused its commit after others committed) leaves v prepared where
//    it is not committed; the caller must not abort it (AbortEverywhere refuses to, the
//    first host having committed): the next ResolvePending rolls it forward everywhere.
Result<CommitOutcome> PrepareAndCommit(const std::vector<store::Client*>& clients,
                                       std::vector<int> participants, const std::string& job,
                                       uint64_t version, bool release = true);

// Failure tests: with the environment variable TENPLEX_FAULT_COMMIT=last,
// CommitEverywhere of two or more participants does not send the commit to its last
// participant in commit order and takes it as refused there (FailedPrecondition), after
// the others committed: the version stays prepared on that host.
inline constexpr char kCommitFaultEnv[] = "TENPLEX_FAULT_COMMIT";

// Aborts v on the hosts (ascending, the first alone first); hosts without v are fine.
// FailedPrecondition (and nothing aborted) when the first one already committed v: the
// caller must roll forward instead.
Status AbortEverywhere(const std::vector<store::Client*>& clients, std::vector<int> hosts,
                       const std::string& job, uint64_t version);

struct Resolution {
  std::vector<uint64_t> committed;  // rolled forward
  std::vector<uint64_t> aborted;    // rolled back (prepared or open leftovers)
  std::vector<uint64_t> pending;    // undecidable now (a participant does not answer)
  std::vector<uint64_t> released;   // old versions released after everyone committed
  std::vector<std::string> lines;   // what was done, one line each
  bool changed = false;             // some host was asked to commit, abort or release
};

// Finds prepared and leftover open versions of job on the hosts (urls[h], clients[h];
// null: lost) and decides each by the rule above; `owner` allows roll back and the
// removal of open versions. Copies older than their host's current version are aborted
// whoever calls (they can never be committed). Hosts that do not answer are skipped.
Result<Resolution> ResolvePending(const std::vector<std::string>& urls,
                                  const std::vector<store::Client*>& clients,
                                  const std::string& job, bool owner);
// The same from a listing of the job read from these clients (job_listing.h); it is
// stale once the result says changed.
Result<Resolution> ResolvePending(const std::vector<std::string>& urls,
                                  const std::vector<store::Client*>& clients,
                                  const std::string& job, bool owner, const JobListing& listing);

}  // namespace tenplex::cluster
