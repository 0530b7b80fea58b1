"""One chaos run end to end, and campaigns of runs: the loop around the steps (actions.py), the checks, and
the report (report.py).

`run(scenario, seed, duration_s, base_dir)`:
1. a fresh ChaosCluster under <base_dir>/<scenario>-s<seed>-<time> (ZooKeeper, 3 bookies or the scenario's
   count, 2 brokers, each broker reaching ZooKeeper through its own proxy; the scenario's BKSIM_ overrides);
2. the workload (workload.py): two ledger writers (shapes 2/2/2 and 3/3/2) and one topic producer;
3. the scenario's steps at their times (scenarios.py; what each does: actions.py), each one an event on the
   timeline; a restarted or resumed process counts as healed once it is registered again (its recovery time
   is on the timeline);
4. after the last step, `TAIL_S` more seconds of workload (it must acknowledge again: liveness);
5. heal anything still broken (and say so; a bookie lost for good stays lost), stop the workload (flush the
   producer, writers close their ledgers), then check.py: ledgers (recover what is OPEN, two readers) and topic
   (two subscriptions); where autorecovery had to repair (a bookie lost, copies destroyed), the check of all
   ledgers is asked for again, every closed ledger must become fully replicated within the bound, and every
   entry of the writers' ledgers must be on the Qw bookies of its write set with identical bytes;
6. stop the brokers and bookies (SIGTERM) and run `bksim audit --local` over the bookies' journals (not those
   of the bookies lost for good: their disks are gone) with the metadata from ZooKeeper: the verdict must be
   clean;
7. report.json and report.txt in the run directory (report.py: timeline, throughput per second and its dips,
   recovery times, counts, audit verdict, violations, verdict). A passing run's data directories are removed
   unless `keep`; a failing run keeps everything.

Violations (exit status 1): lost, reordered, divergent > 0; topic duplicates > 0 (dedup is on, so none is
documented); a ledger not CLOSED after recovery; a read that failed; no acknowledgement in the tail after the
last fault; a process that died without being killed; the audit not clean; a fault's own check that failed.

Bounds: the workload threads are joined within JOIN_TIMEOUT_S, the producer flushed within FLUSH_TIMEOUT_S, the
audit done within AUDIT_TIMEOUT_S; a step waits within its action's own bound. Sleeps only keep the schedule.

With `secure` (`bksim chaos run --secure`) the same run happens on a secured cluster: TLS on every gRPC link,
tokens and authorization at the brokers, ZooKeeper digest ACLs (ChaosCluster's `security`); the checks are the
same and must pass the same way.

`campaign(runs, seed, ...)` draws (scenario, seed) pairs, runs them one after another with a progress line,
and summarises: per scenario, runs, acknowledged operations, lost, duplicates, reordered, divergent, audit
verdicts, median recovery time.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

from bksim.adapters import processes
from bksim.adapters.zk_client import CREDENTIALS_ENV
from bksim.chaos import actions, check, replicas, wipe
from bksim.chaos.actions import ChaosError, RunState
from bksim.chaos.cluster import ChaosCluster, ClusterSpec, Node
from bksim.chaos.disk import Flip
from bksim.chaos.report import Report, aborted, recovery_times, render_text, summary_row, summary_table, throughput
from bksim.chaos.report import write as write_report
from bksim.chaos.scenarios import SCENARIOS, StepTarget, plan as make_plan
from bksim.chaos.workload import TOPIC, LedgerWriter, Recorder, TopicWorkload, run_writers
from bksim.security.kit import SecurityKit

__all__ = ["CHILD_ENV", "ChaosError", "campaign", "render_text", "run", "run_audit"]

# Options of every bookie and broker of a chaos cluster (short timeouts so faults show within seconds).
CHILD_ENV = {
    "BKSIM_BROKER_BOOKIE_TIMEOUT_MS": "3000",
    "BKSIM_BROKER_SHUTDOWN_GRACE_MS": "3000",
    "BKSIM_BOOKIE_SHUTDOWN_GRACE_MS": "3000",
    "BKSIM_TOPIC_LEDGER_ENTRIES_MAX": "300",
    "BKSIM_TOPIC_CURSOR_PERSIST_INTERVAL_MS": "200",
}
LEDGER_SHAPES = ((2, 2, 2), (3, 3, 2))
LEDGER_RATE = 150.0  # entries/s per writer
TOPIC_RATE = 150.0  # messages/s
TAIL_S = 3.0  # workload after the last step (and after healing) before the checks
JOIN_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 60.0
AUDIT_TIMEOUT_S = 300.0
AUDIT_STOP_TIMEOUT_S = 15.0  # SIGTERM of each broker and bookie before the audit
DURATION_MIN_S = 5.0
SMALL_DISK_MB = 64


def _now_tag() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


# ------------------------------------------------------------------------------------------------ one run
class _Run:
    def __init__(self, scenario: str, seed: int, duration_s: float, run_dir: str, log, secure: bool = False) -> None:
        self.scenario = scenario
        self.secure = secure
        self.seed = seed
        self.duration_s = duration_s
        self.run_dir = run_dir
        self.log = log
        self.steps = make_plan(scenario, seed, duration_s)
        self.rng = random.Random(f"{scenario}/{seed}/targets")
        self.recorder: Recorder | None = None
        self.problems: list[str] = []  # things that went wrong in the run itself
        self.failed_checks: list[str] = []  # a fault's own check failed (a violation)

    def execute(self) -> Report:
        small = {}
        if any(s.target == StepTarget.SMALL_DISK_BOOKIE for s in self.steps):
            small = {f"bookie-{self.rng.randint(1, 3)}": SMALL_DISK_MB}
        scenario = SCENARIOS[self.scenario]
        kit = SecurityKit.create(os.path.join(self.run_dir, "security")) if self.secure else None
        spec = ClusterSpec(bookies=scenario.bookies, zookeepers=scenario.zookeepers,
                           child_env=dict(CHILD_ENV) | dict(scenario.env),
                           bookie_links=scenario.links, small_ledger_disk=small, security=kit)
        started = time.monotonic()
        report = Report(self.scenario, self.seed, self.duration_s, self.run_dir,
                        plan=[s.to_dict() for s in self.steps], secure=self.secure or None)
        with ChaosCluster(self.run_dir, spec, log=self.log) as cluster:
            report.cluster_start_s = round(time.monotonic() - started, 2)
            security_problems = check.check_security(cluster) if self.secure else []
            addresses = [b.address for b in cluster.brokers]
            self.recorder = rec = Recorder(time.monotonic())
            if self.secure:
                self.failed_checks.extend(f"security: {p}" for p in security_problems)
                rec.event("check", "secured: a call without a token is UNAUTHENTICATED, plaintext gets no answer, "
                                   "anonymous ZooKeeper gets NoAuth" if not security_problems
                          else f"secured: {len(security_problems)} refusal(s) missing")
            stop = threading.Event()
            creds = cluster.credentials
            topic = TopicWorkload(addresses, rec, stop, rate=TOPIC_RATE, credentials=creds)
            writers = [LedgerWriter(f"ledgers-{e}/{qw}/{qa}", (e, qw, qa), addresses, rec, stop, rate=LEDGER_RATE,
                                    credentials=creds, **dict(scenario.writer_options))
                       for e, qw, qa in LEDGER_SHAPES]
            state = RunState(cluster, rec, topic, writers, self.rng, self.problems, self.failed_checks)
            try:
                self._workload_and_steps(state, stop, report)
                rec.event("workload", f"stopped: {topic.sent} messages sent, "
                          f"{sum(len(w.ledgers) + len(w.deleted) for w in writers)} ledgers created")
                died = cluster.check_processes()
                self.problems.extend(f"unexpected exit: {d}" for d in died)
                if died:
                    actions.heal_all(state)
                self._check(state, addresses, report)
                if state.repair:
                    self._check_repair(state)
            finally:
                topic.close()
            report.ledger_writers = [{"name": w.name, "ledgers": len(w.ledgers), "create_failures": w.create_failures,
                                      "ends": dict(collections.Counter(r.end for r in w.ledgers))}
                                     | ({"deleted": len(w.deleted), "delete_failures": w.delete_failures}
                                        if w.keep_closed else {}) for w in writers]
            report.ledger_ends = [{"ledger_id": r.ledger_id, "writer": r.writer, "end": r.end, "detail": r.end_detail}
                                  for w in writers for r in w.ledgers if r.end != "closed"]
            self._audit(state, report)
        if state.rereplication:
            report.rereplication = state.rereplication
        report.failed_checks = self.failed_checks
        report.timeline = rec.events
        report.faults = state.faults
        report.throughput = throughput(rec, state.faults)
        report.recovery = recovery_times(rec, state.faults, report.tail["from_s"], report.tail["to_s"])
        report.problems = self.problems
        report.judge()
        report.elapsed_s = round(time.monotonic() - started, 1)
        return report

    def _workload_and_steps(self, state: RunState, stop: threading.Event, report: Report) -> None:
        """Start the workload, run the steps at their times, heal what is left, keep the workload going for the
        tail, then stop it (each thread joined within JOIN_TIMEOUT_S, the producer flushed)."""
        rec, topic, writers = state.recorder, state.topic, state.writers
        topic.setup()
        rec.event("workload", f"topic {TOPIC} owned by {topic.client.lookup(TOPIC)['broker_id']}")
        threads = [threading.Thread(target=lambda: asyncio.run(run_writers(writers)), name="chaos-ledgers",
                                    daemon=True),
                   threading.Thread(target=topic.run, name="chaos-topic", daemon=True)]
        for th in threads:
            th.start()
        rec.event("workload", "started: 2 ledger writers (2/2/2, 3/3/2) and 1 topic producer")
        try:
            for step in self.steps:
                delay = step.at - rec.now()
                if delay > 0:
                    time.sleep(delay)  # the schedule: the next fault or heal is due then
                actions.apply(state, step)
            healed = actions.heal_all(state)
            if healed:
                self.problems.append(f"healed after the schedule: {', '.join(healed)}")
            rest = max(self.duration_s - rec.now(), 0.0)
            tail_from = rec.now()
            time.sleep(max(rest, TAIL_S))  # the calm tail: the workload must acknowledge again
            report.tail = {"from_s": round(tail_from, 3), "to_s": round(rec.now(), 3)}
        finally:
            stop.set()
            for th in threads:
                th.join(JOIN_TIMEOUT_S)
                if th.is_alive():
                    self.problems.append(f"workload thread {th.name} did not stop within {JOIN_TIMEOUT_S:.0f} s")
            topic.finish(FLUSH_TIMEOUT_S)

    def _check(self, state: RunState, addresses: list[str], report: Report) -> None:
        """Ledgers and topic read back (check.py), and the flipped entries read around."""
        topic = state.topic
        receipts, duplicate_receipts, failed = topic.snapshot()
        t = time.monotonic()
        creds = state.cluster.credentials
        ledgers = asyncio.run(check.check_ledgers([r for w in state.writers for r in w.ledgers], addresses, creds))
        topic_counts = check.check_topic(addresses, receipts, duplicate_receipts, topic.sent, credentials=creds)
        topic_counts["failed_sends"] = len(failed)
        reasons = collections.Counter(failed.values())
        topic_counts["failed_send_reasons"] = [{"reason": r, "sends": n} for r, n in reasons.most_common(3)]
        report.entrylog_flips = [self._check_flip(state, v, flip, addresses) for v, flip in state.flips]
        report.check_s = round(time.monotonic() - t, 2)
        state.recorder.event("check", "checks done")
        report.ledgers = ledgers
        report.topic = topic_counts

    def _check_repair(self, state: RunState) -> None:
        """Every ledger is closed now: the check of all ledgers once more (damage found only now), full
        replication within the bound, then every entry on Qw bookies with identical bytes."""
        cluster, rec = state.cluster, state.recorder
        t = time.monotonic()
        with replicas.ReplicaWatch(cluster) as watch:
            if state.wiped:
                live = next(b for b in cluster.bookies if b.alive())
                requested_ms, said = replicas.request_check_all(live, cluster.run_dir)
                rec.event("check", f"operator: bksim autorecovery check-all: {said}")
                if watch.wait_check_all_ran(requested_ms, actions.REREPLICATION_TIMEOUT_S) is None:
                    self.failed_checks.append(f"the auditor did not run the requested check of all ledgers "
                                              f"within {actions.REREPLICATION_TIMEOUT_S:.0f} s")
            seconds, left = watch.wait_replicated(set(state.lost), t, actions.REREPLICATION_TIMEOUT_S)
            if seconds is None:
                self.failed_checks.append(f"autorecovery did not restore every closed ledger within "
                                          f"{actions.REREPLICATION_TIMEOUT_S:.0f} s after the workload: {left}")
            else:
                rec.event("check", "every closed ledger fully replicated after the workload", seconds=round(seconds, 3))
            ledger_ids = sorted({r.ledger_id for w in state.writers for r in w.ledgers})
            problems = watch.replica_problems(ledger_ids)
        self.failed_checks.extend(f"replicas: {p}" for p in problems)
        if not problems:
            rec.event("check", f"{len(ledger_ids)} ledgers: every entry on its Qw bookies with identical bytes")

    def _check_flip(self, state: RunState, v: Node, flip: Flip, brokers: list[str]) -> dict:
        """The damaged copy is still served (not "no entry") and fails its digest; a broker read returns the
        acknowledged bytes, so the reader failed over."""
        out = {"bookie": v.name, "ledger_id": flip.ledger_id, "entry_id": flip.entry_id}
        problems = check.check_flip(v.address, brokers, flip, state.cluster.credentials)
        out["problems"] = problems
        self.failed_checks.extend(f"entrylog flip {flip.ledger_id}:{flip.entry_id} on {v.name}: {p}" for p in problems)
        if not problems:
            state.recorder.event("check", f"{v.name} serves {flip.ledger_id}:{flip.entry_id} with a bad digest; "
                                          f"the brokers read the acknowledged bytes (failed over)")
        return out

    def _audit(self, state: RunState, report: Report) -> None:
        """The audit reads quiescent journals: stop brokers and bookies (SIGTERM), keep ZooKeeper for metadata."""
        cluster = state.cluster
        for node in cluster.brokers + cluster.bookies:
            processes.stop(node.pid, AUDIT_STOP_TIMEOUT_S)
            node.pid = None
        out_dir = os.path.join(self.run_dir, "audit")
        journals = [b.journal_dir for b in cluster.bookies if b.node_id not in state.lost]
        report.audit = run_audit(cluster, out_dir, journals)
        if (state.wiped or state.lost_copies) and not state.repair:
            report.audit["judged"] = _judge_audit(state, out_dir)


def _judge_audit(state: RunState, out_dir: str) -> dict:
    """Wiped or truncated bookies lost copies on purpose: the audit must report those and nothing else."""
    try:
        with open(os.path.join(out_dir, "report.json")) as f:
            audit_report = json.load(f)
    except (OSError, ValueError) as e:
        return {"problems": [f"no audit report.json to judge: {e}"], "figures": {}}
    if state.wiped:
        (wiped,) = state.wiped  # one wipe per run
        problems, figures = wipe.judge_audit(audit_report, wiped)
        expected = f"the copies of wiped bookie {wiped}"
    else:
        problems, figures = check.judge_truncation(audit_report, state.lost_copies)
        expected = f"the copies the truncation removed on {', '.join(sorted(state.lost_copies))}"
    return {"problems": problems, "figures": figures, "expected": expected}


def run_audit(cluster: ChaosCluster, out_dir: str, journals: list[str] | None = None) -> dict:
    """`bksim audit --local` over the bookies' journals and entry logs (`journals`, default every bookie's),
    metadata from the live ZooKeeper."""
    argv = [sys.executable, "-m", "bksim.cli.main", "audit", "--local", "--no-parquet", "--quiet", "--json",
            "--journals", *(journals if journals is not None else cluster.journal_dirs()), "--zookeeper", cluster.zk_connect, "--out", out_dir]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    if CREDENTIALS_ENV in cluster.child_env:  # digest ACLs: the audit reads the metadata with the same credentials
        env[CREDENTIALS_ENV] = cluster.child_env[CREDENTIALS_ENV]
    t = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=cluster.run_dir, env=env, capture_output=True, text=True,
                              timeout=AUDIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"verdict": "ERROR", "exit_status": None, "error": f"audit did not finish in {AUDIT_TIMEOUT_S:.0f} s"}
    out = {"exit_status": done.returncode, "seconds": round(time.monotonic() - t, 2)}
    try:
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        out["verdict"] = summary.get("verdict", "?")
        out["totals"] = summary.get("totals", {})
    except (ValueError, IndexError):
        out["verdict"] = "ERROR"
        out["error"] = (done.stderr or done.stdout)[-2000:]
    if done.returncode not in (0, 1):
        out["verdict"] = "ERROR"
        out["error"] = (done.stderr or done.stdout)[-2000:]
    return out


def run(scenario: str, seed: int, duration_s: float, base_dir: str, *, keep: bool = False, log=print,
        secure: bool = False) -> dict:
    """One run; writes report.json and report.txt into its run directory and returns the report (plain data,
    as report.json holds it). `secure`: the cluster runs with TLS on every gRPC link, token authentication and
    authorization at the brokers and ZooKeeper digest ACLs (security.kit, under <run_dir>/security); the
    workload, checks and audit present the client certificate, the super-user's token and the credentials."""
    if scenario not in SCENARIOS:
        raise ChaosError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    if duration_s < DURATION_MIN_S:
        raise ChaosError(f"--duration must be >= {DURATION_MIN_S:.0f} s, got {duration_s}")
    run_dir = os.path.join(os.path.abspath(base_dir), f"{scenario}-s{seed}-{_now_tag()}-{os.getpid()}")
    os.makedirs(run_dir, exist_ok=False)
    chaos_run = _Run(scenario, seed, duration_s, run_dir, log, secure)
    try:
        report = chaos_run.execute().to_dict()
    except Exception as e:  # the run could not be carried out: a failed run, with what happened so far
        timeline = chaos_run.recorder.events if chaos_run.recorder else []
        report = aborted(scenario, seed, duration_s, run_dir, timeline, chaos_run.problems, e).to_dict()
        if secure:
            report["secure"] = True
    write_report(report, run_dir)
    if report["verdict"] == "PASS" and not keep:
        for name in os.listdir(run_dir):
            path = os.path.join(run_dir, name)
            if os.path.isdir(path) and (name.startswith("bookie-") or name.startswith("zookeeper")):
                shutil.rmtree(path, ignore_errors=True)
    return report


# ------------------------------------------------------------------------------------------------ campaigns
def campaign(runs: int, seed: int, duration_s: float, base_dir: str, scenarios: list[str] | None = None, *,
             keep: bool = False, log=print, progress=None, secure: bool = False) -> tuple[list[dict], str]:
    names = scenarios or list(SCENARIOS)
    for n in names:
        if n not in SCENARIOS:
            raise ChaosError(f"unknown scenario {n!r}; known: {', '.join(SCENARIOS)}")
    rng = random.Random(seed)
    rows: list[dict] = []
    started = time.monotonic()
    for i in range(1, runs + 1):
        name = rng.choice(names)
        run_seed = rng.randrange(1, 1 << 31)
        report = run(name, run_seed, duration_s, base_dir, keep=keep, log=log, secure=secure)
        row = summary_row(report)
        rows.append(row)
        if progress:
            failed = sum(1 for r in rows if r["verdict"] != "PASS")
            elapsed = time.monotonic() - started
            progress(f"[{i}/{runs}] {name} seed {run_seed}: {row['verdict']} ({row['elapsed_s']} s; "
                     f"{row['acknowledged']:,} acked, recovery {row['recovery_s']} s) | failed {failed} | "
                     f"elapsed {elapsed / 60:.1f} min, eta {elapsed / i * (runs - i) / 60:.1f} min"
                     + (f"\n    {row['violations'][:3]} -> {row['run_dir']}" if row["verdict"] != "PASS" else ""))
    table = summary_table(rows)
    tag = _now_tag()
    os.makedirs(base_dir, exist_ok=True)
    with open(os.path.join(base_dir, f"campaign-{tag}.json"), "w") as f:
        json.dump({"runs": runs, "seed": seed, "duration_s": duration_s, "rows": rows}, f, indent=1)
    with open(os.path.join(base_dir, f"campaign-{tag}.md"), "w") as f:
        f.write(table + "\n")
    return rows, table
