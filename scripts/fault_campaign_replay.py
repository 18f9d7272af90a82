"""Capability replay kinds of the hostile campaign (issue 35; scripts/fault_campaign_hostile.py).

A peer that captured a data-plane capability (transport/capability.h: "read version V of
incarnation I of job J for the transform V -> W until T") replays it where it must no
longer work. The campaign holds the daemon token, so it mints the capability exactly as a
participant's prepare does (tenplex_hostile_client --capability mint:J:V:W:I); a fetch
with it first reads the tensor (the control: the capability was good), then:

  - replay closed: the transform to W ends on the victim, by POST
    /v1/jobs/J/versions/W/close (what transform/revocation.h sends to hosts that did not
    commit W) or by the victim committing W itself; the replay must be refused, counted
    as tenplex_fetch_refused_total{reason="expired"}.
  - replay recreated: the job is deleted and created again under the same name (a new
    jobs/J/INCARNATION); the old capability must be refused, counted as reason="scope".
  - replay scope: a good capability used for another job's tensor, for another window
    (V' -> W' of the same job, read at V), with another host's incarnation, or a probe
    capability for a tensor: each refused, counted as reason="scope".

Each replay runs 2-4 hostile clients (2-16 threads each, 1.5-3 s, some SIGKILLed);
every fetch they finish must be PERMISSION_DENIED, and the victim's refusals counter must
grow by at least as many. The jobs are small (one 64-byte tensor) and made only on the
victim, under names of their own, so the campaign's job j and its transforms are not
touched; the trial's invariants (authenticated calls every 50 ms, RssAnon, a transform
of j during or after, every daemon alive) are those of the other kinds.
"""

import json
import logging
import os
import secrets
import subprocess
import urllib.request

log = logging.getLogger("fault_campaign_replay")

REPLAY_KINDS = ["replay closed", "replay recreated", "replay scope"]
TENSOR = "rank-00000/x"
TENSOR_BYTES = 64


def http(daemon, method: str, path: str, data: bytes = None, headers: dict = None, timeout: float = 20) -> bytes:
    """One authenticated request; the reply's body (bytes)."""
    h = {"Authorization": "Bearer " + os.environ["TENPLEX_TOKEN"], **(headers or {})}
    req = urllib.request.Request(daemon.url + path, method=method, data=data, headers=h)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def refused(daemon) -> dict:
    """{reason: n} of tenplex_fetch_refused_total."""
    out = {}
    for line in http(daemon, "GET", "/metrics").decode().splitlines():
        if line.startswith('tenplex_fetch_refused_total{reason="'):
            key, value = line.split()
            out[key.split('"')[1]] = int(float(value))
    return out


class ReplayKinds:
    """Mixed into HostileCampaign: needs daemons, rng, client, tmp, address(),
    spawn_client(), final() and run_clients()."""

    replays = 0

    def make_job(self, victim, version=1, job=None):
        """A job of its own on the victim with `version` committed (one tensor);
        returns (job, incarnation)."""
        d = self.daemons[victim]
        if job is None:
            ReplayKinds.replays += 1
            job = "replay%d-%d" % (os.getpid(), ReplayKinds.replays)
        http(d, "POST", "/v1/jobs/%s/versions?version=%d" % (job, version), b"{}", {"Content-Type": "application/json"})
        http(
            d,
            "PUT",
            "/v1/tensors/jobs/%s/%d/%s?dtype=U8&shape=%d" % (job, version, TENSOR, TENSOR_BYTES),
            secrets.token_bytes(TENSOR_BYTES),
            {"Content-Type": "application/octet-stream"},
        )
        http(d, "POST", "/v1/jobs/%s/versions/%d/commit" % (job, version))
        return job, json_of(http(d, "GET", "/v1/jobs/" + job))["incarnation"]

    def read_once(self, victim, cap, region):
        """One short client reading `region` with `cap`: its final JSON line (or None)."""
        name = "control%d" % ReplayKinds.replays
        p, out = self.spawn_client(
            self.address(victim),
            [
                "--mode",
                "flood",
                "--threads",
                1,
                "--runs",
                1,
                "--run-bytes",
                TENSOR_BYTES,
                "--seconds",
                0.2,
                "--capability",
                cap,
                "--region",
                region,
            ],
            name,
        )
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        return self.final(p, out)

    def replay(self, victim, result, uses, reason):
        """Runs 2-4 clients, each replaying one (capability, region) of `uses`; every
        finished fetch must be PERMISSION_DENIED, and the victim's refusals of `reason`
        must grow by at least as many. None, or ("refusal wrong", why)."""
        rng = self.rng
        before = refused(self.daemons[victim])
        specs = []
        for k in range(rng.randint(2, 4)):
            cap, region = uses[k % len(uses)]
            specs.append(
                [
                    "--mode",
                    "flood",
                    "--capability",
                    cap,
                    "--region",
                    region,
                    "--runs",
                    1,
                    "--run-bytes",
                    TENSOR_BYTES,
                    "--threads",
                    rng.choice([2, 8, 16]),
                    "--seconds",
                    rng.uniform(1.5, 3),
                ]
            )
        fates = [rng.choice(["run", "run", "kill"]) for _ in specs]
        problem = self.run_clients(specs, fates, [{"PERMISSION_DENIED"}] * len(specs), result)
        if problem:
            return problem
        after = refused(self.daemons[victim])
        denied = result["codes"].get("PERMISSION_DENIED", 0)
        grew = after.get(reason, 0) - before.get(reason, 0)
        result["refused"] = {"reason": reason, "denied": denied, "counted": grew}
        if denied == 0 and any(f == "run" for f in fates):
            return "refusal wrong", "no replayed fetch was answered at all: %s" % result["codes"]
        if grew < denied:
            return "refusal wrong", "%d replays refused, tenplex_fetch_refused_total{reason=%r} grew by %d" % (
                denied,
                reason,
                grew,
            )
        return None

    def control(self, victim, job, inc, version, to):
        """The capability mint:job:version:to:inc reads the tensor now; None or a problem."""
        cap = "mint:%s:%d:%d:%s" % (job, version, to, inc)
        fin = self.read_once(victim, cap, "jobs/%s/%d/%s" % (job, version, TENSOR))
        if fin is None or set(fin["codes"]) != {"OK"}:
            return "refusal wrong", "the control read with a good capability failed: %s" % fin
        return None

    def with_jobs(self, victim, count, act):
        """Makes `count` jobs on the victim, checks that a capability for the first one's
        transform 1 -> 2 reads it (the control), runs act(jobs, incarnations) and deletes
        the jobs again. act's problem, or None."""
        made = [self.make_job(victim) for _ in range(count)]
        jobs, incs = [m[0] for m in made], [m[1] for m in made]
        try:
            return self.control(victim, jobs[0], incs[0], 1, 2) or act(jobs, incs)
        finally:
            self.drop_jobs(victim, jobs)

    def replay_closed(self, victim, result):
        def act(jobs, incs):
            job = jobs[0]
            how = self.rng.choice(["close", "close", "commit"])
            result["ended_by"] = how
            if how == "close":
                http(self.daemons[victim], "POST", "/v1/jobs/%s/versions/2/close" % job)
            else:
                self.make_job(victim, version=2, job=job)
            region = "jobs/%s/1/%s" % (job, TENSOR)
            return self.replay(victim, result, [("mint:%s:1:2:%s" % (job, incs[0]), region)], "expired")

        return self.with_jobs(victim, 1, act)

    def replay_recreated(self, victim, result):
        def act(jobs, incs):
            job, inc = jobs[0], incs[0]
            http(self.daemons[victim], "DELETE", "/v1/jobs/" + job)
            _, new_inc = self.make_job(victim, job=job)
            if new_inc == inc:
                return "refusal wrong", "job %s created again kept incarnation %s" % (job, inc)
            region = "jobs/%s/1/%s" % (job, TENSOR)
            return self.replay(victim, result, [("mint:%s:1:2:%s" % (job, inc), region)], "scope")

        return self.with_jobs(victim, 1, act)

    def replay_scope(self, victim, result):
        def act(jobs, incs):
            job, inc, other = jobs[0], incs[0], jobs[1]
            mine, theirs = "jobs/%s/1/%s" % (job, TENSOR), "jobs/%s/1/%s" % (other, TENSOR)
            stranger = secrets.token_hex(8)  # another host's copy of the job
            uses = [
                ("mint:%s:1:2:%s" % (job, inc), theirs),  # another job
                ("mint:%s:3:4:%s" % (job, inc), mine),  # another window
                ("mint:%s:1:2:%s" % (job, stranger), mine),  # another incarnation
                ("probe", mine),  # a probe capability
            ]
            self.rng.shuffle(uses)
            return self.replay(victim, result, uses, "scope")

        return self.with_jobs(victim, 2, act)

    def drop_jobs(self, victim, jobs):
        for job in jobs:
            try:
                http(self.daemons[victim], "DELETE", "/v1/jobs/" + job)
            except OSError as e:  # (a daemon that died is the trial's crash, reported there)
                log.warning("could not delete %s: %s", job, e)


def json_of(body: bytes):
    return json.loads(body or b"null")
