"""One chaos run end to end, and campaigns of runs.

`run(scenario, seed, duration_s, base_dir)`:
1. a fresh ChaosCluster under <base_dir>/<scenario>-s<seed>-<time> (ZooKeeper, 3 bookies, 2 brokers, each
   broker reaching ZooKeeper through its own proxy);
2. the workload (workload.py): two ledger writers (shapes 2/2/2 and 3/3/2) and one topic producer;
3. the scenario's steps at their times (scenarios.py), each one an event on the timeline; a restarted or
   resumed process counts as healed once it is registered again (its recovery time is on the timeline);
4. after the last step, `TAIL_S` more seconds of workload (it must acknowledge again: liveness);
5. heal anything still broken (and say so), stop the workload (flush the producer, writers close their
   ledgers), then check.py: ledgers (recover what is OPEN, two readers) and topic (two subscriptions);
6. stop the brokers and bookies (SIGTERM) and run `bksim audit --local` over the bookies' journals with the
   metadata from ZooKeeper: the verdict must be clean;
7. report.json and report.txt in the run directory (timeline, throughput per second and its dips, recovery
   times, counts, audit verdict, violations, verdict). A passing run's data directories are removed unless
   `keep`; a failing run keeps everything.

Violations (exit status 1): lost, reordered, divergent > 0; topic duplicates > 0 (dedup is on, so none is
documented); a ledger not CLOSED after recovery; a read that failed; no acknowledgement in the tail after the
last fault; a process that died without being killed; the audit not clean.

`campaign(runs, seed, ...)` draws (scenario, seed) pairs, runs them one after another with a progress line,
and summarises: per scenario, runs, acknowledged operations, lost, duplicates, reordered, divergent, audit
verdicts, median recovery time.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time

from bksim.adapters import processes
from bksim.chaos import check
from bksim.chaos.cluster import ChaosCluster, ClusterSpec, Node
from bksim.chaos.scenarios import SCENARIOS, Step, plan as make_plan
from bksim.chaos.workload import TOPIC, LedgerWriter, Recorder, TopicWorkload, run_writers
from bksim.formats.journal import encode_file_header, parse_journal_file_name, scan_records

FILE_HEADER_BYTES = len(encode_file_header("00000000-0000-0000-0000-000000000000"))

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
GAP_S = 0.5  # an acknowledgement gap at least this long is a disruption
JOIN_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 60.0
AUDIT_TIMEOUT_S = 300.0
HEAL_TIMEOUT_S = 60.0
DURATION_MIN_S = 5.0


class ChaosError(RuntimeError):
    """A run could not be carried out (not a violation: the cluster could not start, a step failed)."""


def _now_tag() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


# ------------------------------------------------------------------------------------------------ one run
class _Run:
    def __init__(self, scenario: str, seed: int, duration_s: float, run_dir: str, log) -> None:
        self.scenario = scenario
        self.seed = seed
        self.duration_s = duration_s
        self.run_dir = run_dir
        self.log = log
        self.steps = make_plan(scenario, seed, duration_s)
        self.rng = random.Random(f"{scenario}/{seed}/targets")
        self.cluster: ChaosCluster | None = None
        self.recorder: Recorder | None = None
        self.topic: TopicWorkload | None = None
        self.victims: list[Node] = []
        self.faults: list[dict] = []  # {"step", "t", "victims", "healed_t", "heal_s"}
        self.problems: list[str] = []  # things that went wrong in the run itself
        self.log_marks: dict[str, int] = {}  # node name -> its log's size when its journal was torn

    # -- targets ------------------------------------------------------------------------------------------
    def _owner(self) -> Node:
        brokers = self.cluster.brokers
        try:
            broker_id = self.topic.client.lookup(TOPIC)["broker_id"]
            for b in brokers:
                if b.node_id == broker_id and b.alive():
                    return b
        except Exception as e:  # noqa: BLE001 - fall back to a live broker, and say so
            self.recorder.event("note", f"lookup of the topic owner failed ({type(e).__name__}); a random broker")
        live = [b for b in brokers if b.alive() and not b.paused]
        return self.rng.choice(live or brokers)

    def _targets(self, step: Step) -> list[Node]:
        bookies = [b for b in self.cluster.bookies if b.alive() and not b.paused]
        if step.target == "same":
            return list(self.victims)
        if step.target == "random-bookie":
            return [self.rng.choice(bookies)]
        if step.target == "two-bookies":
            return self.rng.sample(bookies, 2)
        if step.target == "topic-owner":
            return [self._owner()]
        if step.target == "zookeeper":
            return []
        raise ChaosError(f"unknown step target {step.target!r}")

    # -- steps --------------------------------------------------------------------------------------------
    def apply(self, step: Step) -> None:
        cluster, rec = self.cluster, self.recorder
        victims = self._targets(step)
        names = ", ".join(v.name for v in victims) or "zookeeper"
        t = rec.now()
        if step.action == "kill9":
            for v in victims:
                pid = v.pid
                cluster.kill9(v)
                rec.event("fault", f"kill -9 {v.name} (pid {pid})")
        elif step.action == "kill9-tear":
            for v in victims:
                pid = v.pid
                cluster.kill9(v)
                rec.event("fault", f"kill -9 {v.name} (pid {pid})")
                what = tear_journal(os.path.join(v.home, "journal"), self.rng)
                rec.event("fault", f"{v.name}: {what}")
                if what.startswith("tore "):
                    v.torn_pending = True
                    self.log_marks[v.name] = os.path.getsize(v.log_path)
        elif step.action == "pause":
            for v in victims:
                cluster.pause(v)
                rec.event("fault", f"SIGSTOP {v.name} (pid {v.pid})")
        elif step.action == "restart":
            for v in victims:
                cluster.spawn(v)
                rec.event("heal", f"restart {v.name} (pid {v.pid})")
            for v in victims:
                waited = cluster.wait_registered(v)
                rec.event("recovered", f"{v.name} registered again", seconds=round(waited, 3))
                if v.torn_pending:
                    v.torn_pending = False
                    with open(v.log_path, "rb") as f:
                        f.seek(self.log_marks.get(v.name, 0))
                        replay_log = f.read().decode(errors="replace")
                    if "torn" in replay_log:
                        rec.event("recovered", f"{v.name}: journal replay truncated the torn tail")
                    else:
                        self.problems.append(f"{v.name}: no torn tail reported by journal replay after the tear")
        elif step.action == "resume":
            for v in victims:
                cluster.resume(v)
                rec.event("heal", f"SIGCONT {v.name} (pid {v.pid})")
            for v in victims:
                waited = cluster.wait_registered(v)
                rec.event("recovered", f"{v.name} registered (again) after the pause", seconds=round(waited, 3))
        elif step.action == "zk-stop-start":
            rec.event("fault", f"stop ZooKeeper (pid {cluster.zookeeper.pid}) for {step.down_s:.1f} s")
            cluster.restart_zookeeper(step.down_s)
            rec.event("heal", f"ZooKeeper serving again (pid {cluster.zookeeper.pid})")
            for node in cluster.bookies + cluster.brokers:
                waited = cluster.wait_registered(node)
                rec.event("recovered", f"{node.name} registered after the ZooKeeper restart",
                          seconds=round(waited, 3))
        elif step.action == "zk-cut":
            for v in victims:
                cluster.proxies[v.name].block()
                rec.event("fault", f"cut {v.name} off from ZooKeeper (proxy {cluster.proxies[v.name].address})")
        elif step.action == "zk-heal":
            for v in victims:
                cluster.proxies[v.name].unblock()
                rec.event("heal", f"reconnect {v.name} to ZooKeeper")
            for v in victims:
                waited = cluster.wait_registered(v)
                rec.event("recovered", f"{v.name} registered again", seconds=round(waited, 3))
        else:
            raise ChaosError(f"unknown step action {step.action!r}")
        if step.fault:
            self.faults.append({"action": step.action, "t": round(t, 3), "victims": names})
        else:
            for f in reversed(self.faults):
                if "healed_t" not in f:
                    f["healed_t"] = round(rec.now(), 3)
                    break
        if step.target != "same":
            self.victims = victims
        if not step.fault and self.topic is not None and self.topic.client is not None:
            try:
                rec.event("note", f"topic owner now {self.topic.client.lookup(TOPIC)['broker_id']}")
            except Exception as e:  # noqa: BLE001 - a note only
                rec.event("note", f"topic lookup failed: {type(e).__name__}: {str(e)[:120]}")

    def heal_all(self) -> list[str]:
        """Whatever a step left broken (it should be none): resume, reconnect, restart; returns what was done."""
        done = []
        cluster = self.cluster
        if cluster.zookeeper.pid is None or not cluster.zookeeper.is_running():
            cluster.zookeeper.start()
            cluster.zookeeper.wait_ready(HEAL_TIMEOUT_S)
            done.append("started ZooKeeper")
        for name, proxy in cluster.proxies.items():
            if proxy.blocked:
                proxy.unblock()
                done.append(f"reconnected {name} to ZooKeeper")
        for node in cluster.bookies + cluster.brokers:
            if node.paused:
                cluster.resume(node)
                done.append(f"resumed {node.name}")
            if not node.alive():
                cluster.spawn(node)
                done.append(f"restarted {node.name}")
        for node in cluster.bookies + cluster.brokers:
            cluster.wait_registered(node, HEAL_TIMEOUT_S)
        for what in done:
            self.recorder.event("heal", f"final heal: {what}")
        return done

    # -- the run ------------------------------------------------------------------------------------------
    def execute(self) -> dict:
        spec = ClusterSpec(child_env=dict(CHILD_ENV))
        started = time.monotonic()
        report: dict = {"scenario": self.scenario, "seed": self.seed, "duration_s": self.duration_s,
                        "run_dir": self.run_dir, "plan": [s.to_dict() for s in self.steps]}
        with ChaosCluster(self.run_dir, spec, log=self.log) as cluster:
            self.cluster = cluster
            report["cluster_start_s"] = round(time.monotonic() - started, 2)
            addresses = [b.address for b in cluster.brokers]
            self.recorder = rec = Recorder(time.monotonic())
            stop = threading.Event()
            self.topic = topic = TopicWorkload(addresses, rec, stop, rate=TOPIC_RATE)
            writers = [LedgerWriter(f"ledgers-{e}/{qw}/{qa}", (e, qw, qa), addresses, rec, stop, rate=LEDGER_RATE)
                       for e, qw, qa in LEDGER_SHAPES]
            try:
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
                        self.apply(step)
                    healed = self.heal_all()
                    if healed:
                        self.problems.append(f"healed after the schedule: {', '.join(healed)}")
                    rest = max(self.duration_s - rec.now(), 0.0)
                    tail_from = rec.now()
                    time.sleep(max(rest, TAIL_S))  # the calm tail: the workload must acknowledge again
                    report["tail"] = {"from_s": round(tail_from, 3), "to_s": round(rec.now(), 3)}
                finally:
                    stop.set()
                    for th in threads:
                        th.join(JOIN_TIMEOUT_S)
                        if th.is_alive():
                            self.problems.append(f"workload thread {th.name} did not stop within {JOIN_TIMEOUT_S:.0f} s")
                    topic.finish(FLUSH_TIMEOUT_S)
                rec.event("workload", f"stopped: {topic.sent} messages sent, "
                          f"{sum(len(w.ledgers) for w in writers)} ledgers created")
                died = cluster.check_processes()
                self.problems.extend(f"unexpected exit: {d}" for d in died)
                if died:
                    self.heal_all()
                receipts, duplicate_receipts, failed = topic.snapshot()
                t = time.monotonic()
                ledgers = asyncio.run(check.check_ledgers([r for w in writers for r in w.ledgers], addresses))
                topic_counts = check.check_topic(addresses, receipts, duplicate_receipts, topic.sent)
                topic_counts["failed_sends"] = len(failed)
                report["check_s"] = round(time.monotonic() - t, 2)
                rec.event("check", "checks done")
            finally:
                topic.close()
            report["ledgers"] = ledgers
            report["ledger_writers"] = [{"name": w.name, "ledgers": len(w.ledgers), "create_failures": w.create_failures,
                                         "ends": _count(r.end for r in w.ledgers)} for w in writers]
            report["ledger_ends"] = [{"ledger_id": r.ledger_id, "writer": r.writer, "end": r.end,
                                      "detail": r.end_detail} for w in writers for r in w.ledgers if r.end != "closed"]
            report["topic"] = topic_counts
            # the audit reads quiescent journals: stop brokers and bookies (SIGTERM), keep ZooKeeper for metadata
            for node in cluster.brokers + cluster.bookies:
                processes.stop(node.pid, 15.0)
                node.pid = None
            report["audit"] = run_audit(cluster, os.path.join(self.run_dir, "audit"))
        report["timeline"] = self.recorder.events
        report["faults"] = self.faults
        report["throughput"] = throughput(self.recorder, self.faults)
        report["recovery"] = recovery_times(self.recorder, self.faults, report.get("tail", {}).get("from_s"),
                                            report.get("tail", {}).get("to_s"))
        report["problems"] = self.problems
        report["violations"] = violations(report)
        report["verdict"] = "PASS" if not report["violations"] else "FAIL"
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        return report


def tear_journal(journal_dir: str, rng: random.Random) -> str:
    """Append a prefix of a copy of the newest journal's last record (a group write cut short by the crash)."""
    names = sorted(n for n in os.listdir(journal_dir) if parse_journal_file_name(n) is not None) \
        if os.path.isdir(journal_dir) else []
    if not names:
        return f"no journal file in {journal_dir} to tear"
    path = os.path.join(journal_dir, names[-1])
    with open(path, "rb") as f:
        data = f.read()
    scan = scan_records(data, FILE_HEADER_BYTES, newest=True)
    if not scan.records:
        return f"{path}: no record to copy (left as it is)"
    last = scan.records[-1]
    cut = rng.randint(1, last.end - last.offset - 1)
    with open(path, "ab") as f:
        f.write(data[last.offset:last.offset + cut])
    return f"tore {names[-1]}: appended {cut} of a {last.end - last.offset}-byte record at offset {len(data)}"


def _count(items) -> dict:
    out: dict = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def run_audit(cluster: ChaosCluster, out_dir: str) -> dict:
    """`bksim audit --local` over the bookies' journals and entry logs, metadata from the live ZooKeeper."""
    argv = [sys.executable, "-m", "bksim.cli.main", "audit", "--local", "--no-parquet", "--quiet", "--json",
            "--journals", *cluster.journal_dirs(), "--zookeeper", cluster.zookeeper.connect, "--out", out_dir]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
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


def throughput(rec: Recorder, faults: list[dict]) -> dict:
    """Acknowledgements per second of each stream, the baseline before the first fault and the dips."""
    out = {}
    first_fault = min((f["t"] for f in faults), default=None)
    for stream, counts in rec.counts.items():
        last = max(counts, default=-1)
        series = [counts.get(s, 0) for s in range(last + 1)]
        # whole seconds before the first fault (second 0 only when there is nothing else: it starts mid-way)
        cut = int(first_fault) if first_fault is not None else len(series)
        before = series[1:cut] or series[:max(1, cut)]
        baseline = statistics.median(before) if before else None
        during = series[int(first_fault):] if first_fault is not None else []
        low = min(during) if during else None
        out[stream] = {"per_second": series, "baseline_per_s": baseline, "min_per_s_after_first_fault": low,
                       "dip_fraction": (round(1 - low / baseline, 3) if baseline and low is not None else None)}
    return out


def _gaps(times: list[float]) -> list[tuple[float, float]]:
    return [(a, b) for a, b in zip(times, times[1:]) if b - a >= GAP_S]


def recovery_times(rec: Recorder, faults: list[dict], tail_from: float | None, end_t: float | None = None) -> dict:
    """Per fault: from its injection to the end of the last acknowledgement gap (>= GAP_S) that began before
    the next fault, per stream (0 when acks never paused). A stream whose acknowledgements never came back
    before `end_t` (the end of the workload) gets end_t - fault time and is listed in `not_recovered`.
    Also: acknowledgements during the final tail."""
    per_fault = []
    for i, f in enumerate(faults):
        start = f["t"]
        # a gap that begins within GAP_S before the next fault belongs to that fault
        limit = faults[i + 1]["t"] - GAP_S if i + 1 < len(faults) else float("inf")
        entry = {"t": start, "action": f["action"], "victims": f["victims"], "not_recovered": []}
        for stream, times in rec.acks.items():
            ordered = sorted(times)
            if end_t is not None and (not ordered or end_t - ordered[-1] >= GAP_S):
                ordered.append(end_t)  # a gap still open at the end of the workload
                open_gap = True
            else:
                open_gap = False
            ends = [b for a, b in _gaps(ordered) if start - GAP_S <= a < limit and b > start]
            entry[f"{stream}_s"] = round(max(ends) - start, 3) if ends else 0.0
            if open_gap and ends and max(ends) == end_t:
                entry["not_recovered"].append(stream)
        entry["recovery_s"] = max(entry["ledger_s"], entry["topic_s"])
        per_fault.append(entry)
    tail_acks = {s: sum(1 for t in times if tail_from is not None and t >= tail_from) for s, times in rec.acks.items()}
    return {"per_fault": per_fault, "max_s": max((e["recovery_s"] for e in per_fault), default=0.0),
            "tail_acks": tail_acks}


def violations(report: dict) -> list[str]:
    out = []
    for part in ("ledgers", "topic"):
        counts = report.get(part, {})
        for key in ("lost", "reordered", "divergent", "read_errors"):
            if counts.get(key):
                out.append(f"{part}: {key} = {counts[key]}")
    if report.get("topic", {}).get("duplicates"):
        out.append(f"topic: duplicates = {report['topic']['duplicates']} (dedup is on: none is documented)")
    if report.get("ledgers", {}).get("not_closed"):
        out.append(f"ledgers: {report['ledgers']['not_closed']} not CLOSED after recovery")
    tail = report.get("recovery", {}).get("tail_acks", {})
    for stream, n in tail.items():
        if not n:
            out.append(f"liveness: no {stream} acknowledgement in the tail after the last fault was healed")
    audit = report.get("audit", {})
    if audit.get("verdict") != "clean":
        out.append(f"audit: {audit.get('verdict')} (exit {audit.get('exit_status')})")
    out.extend(p for p in report.get("problems", []) if p.startswith("unexpected exit") or "torn tail" in p)
    return out


def render_text(report: dict) -> str:
    lines = [f"chaos {report['scenario']} seed {report['seed']}: {report['verdict']} "
             f"({report.get('elapsed_s', '?')} s, run dir {report['run_dir']})", "", "timeline:"]
    for e in report.get("timeline", []):
        extra = f" ({e['seconds']:.2f} s)" if "seconds" in e else ""
        lines.append(f"  {e['t']:7.2f}s  {e['kind']:<9} {e['what']}{extra}")
    lines.append("")
    lines.append("throughput (acks/s; baseline before the first fault -> lowest second after it):")
    for stream, t in report.get("throughput", {}).items():
        lines.append(f"  {stream:<6} baseline {t['baseline_per_s']}  low {t['min_per_s_after_first_fault']}  "
                     f"dip {t['dip_fraction']}")
    lines.append("recovery (fault -> acknowledgements flowing again):")
    for f in report.get("recovery", {}).get("per_fault", []):
        lines.append(f"  {f['t']:7.2f}s {f['action']:<14} {f['victims']:<20} ledger {f['ledger_s']:.2f} s  "
                     f"topic {f['topic_s']:.2f} s"
                     + (f"  (not recovered: {', '.join(f['not_recovered'])})" if f.get("not_recovered") else ""))
    led, top = report.get("ledgers", {}), report.get("topic", {})
    lines.append(f"ledgers: {led.get('ledgers')} ledgers, {led.get('acknowledged')} entries acknowledged; lost "
                 f"{led.get('lost')}, reordered {led.get('reordered')}, divergent {led.get('divergent')}, "
                 f"recovered at the end {led.get('recovered_at_end')}, not closed {led.get('not_closed')}, "
                 f"unconfirmed kept {led.get('unconfirmed_present')}")
    lines.append(f"topic: {top.get('acknowledged')}/{top.get('sent')} messages receipted; lost {top.get('lost')}, "
                 f"duplicates {top.get('duplicates')}, reordered {top.get('reordered')}, divergent "
                 f"{top.get('divergent')}, failed sends {top.get('failed_sends')}")
    audit = report.get("audit", {})
    lines.append(f"audit: {audit.get('verdict')} ({audit.get('seconds', '?')} s)")
    for p in report.get("problems", []):
        lines.append(f"problem: {p.splitlines()[0]}")
    for v in report.get("violations", []):
        lines.append(f"VIOLATION: {v}")
    for f in (led.get("findings", []) + top.get("findings", []))[:20]:
        lines.append(f"  finding: {f}")
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines) + "\n"


def run(scenario: str, seed: int, duration_s: float, base_dir: str, *, keep: bool = False, log=print) -> dict:
    """One run; writes report.json and report.txt into its run directory and returns the report."""
    if scenario not in SCENARIOS:
        raise ChaosError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    if duration_s < DURATION_MIN_S:
        raise ChaosError(f"--duration must be >= {DURATION_MIN_S:.0f} s, got {duration_s}")
    run_dir = os.path.join(os.path.abspath(base_dir), f"{scenario}-s{seed}-{_now_tag()}-{os.getpid()}")
    os.makedirs(run_dir, exist_ok=False)
    chaos_run = _Run(scenario, seed, duration_s, run_dir, log)
    try:
        report = chaos_run.execute()
    except Exception as e:  # the run could not be carried out: a failed run, with what happened so far
        report = {"scenario": scenario, "seed": seed, "duration_s": duration_s, "run_dir": run_dir,
                  "timeline": chaos_run.recorder.events if chaos_run.recorder else [],
                  "problems": chaos_run.problems + [f"run aborted: {type(e).__name__}: {e}"],
                  "violations": [f"run aborted: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"],
                  "verdict": "FAIL"}
    with open(os.path.join(run_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    text = render_text(report)
    with open(os.path.join(run_dir, "report.txt"), "w") as f:
        f.write(text)
    if report["verdict"] == "PASS" and not keep:
        for name in os.listdir(run_dir):
            path = os.path.join(run_dir, name)
            if os.path.isdir(path) and (name.startswith("bookie-") or name == "zookeeper"):
                shutil.rmtree(path, ignore_errors=True)
    return report


# ------------------------------------------------------------------------------------------------ campaigns
def summary_row(report: dict) -> dict:
    led, top = report.get("ledgers", {}), report.get("topic", {})
    return {"scenario": report["scenario"], "seed": report["seed"], "verdict": report["verdict"],
            "acknowledged": (led.get("acknowledged") or 0) + (top.get("acknowledged") or 0),
            "lost": (led.get("lost") or 0) + (top.get("lost") or 0),
            "duplicates": (led.get("duplicates") or 0) + (top.get("duplicates") or 0),
            "reordered": (led.get("reordered") or 0) + (top.get("reordered") or 0),
            "divergent": (led.get("divergent") or 0) + (top.get("divergent") or 0),
            "audit": report.get("audit", {}).get("verdict", "not run"),
            "recovery_s": report.get("recovery", {}).get("max_s"),
            "elapsed_s": report.get("elapsed_s"), "run_dir": report["run_dir"],
            "violations": report.get("violations", [])}


def summary_table(rows: list[dict]) -> str:
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["scenario"], []).append(r)
    header = ("| scenario | runs | acknowledged ops | lost | duplicates | reordered | divergent | audit | "
              "median recovery (s) | failed runs |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    groups = sorted(by.items()) + ([("**all**", rows)] if len(by) > 1 else [])
    for name, group in groups:
        audits = _count(r["audit"] for r in group)
        audit = ", ".join(f"{k} {v}" for k, v in sorted(audits.items()))
        rec = [r["recovery_s"] for r in group if r["recovery_s"] is not None]
        median = f"{statistics.median(rec):.2f}" if rec else "-"
        lines.append(f"| {name} | {len(group)} | {sum(r['acknowledged'] for r in group):,} | "
                     f"{sum(r['lost'] for r in group)} | {sum(r['duplicates'] for r in group)} | "
                     f"{sum(r['reordered'] for r in group)} | {sum(r['divergent'] for r in group)} | {audit} | "
                     f"{median} | {sum(1 for r in group if r['verdict'] != 'PASS')} |")
    return "\n".join(lines)


def campaign(runs: int, seed: int, duration_s: float, base_dir: str, scenarios: list[str] | None = None, *,
             keep: bool = False, log=print, progress=None) -> tuple[list[dict], str]:
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
        report = run(name, run_seed, duration_s, base_dir, keep=keep, log=log)
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
