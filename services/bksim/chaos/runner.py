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
import collections
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
from bksim.chaos import check, disk, wipe
from bksim.chaos.cluster import ChaosCluster, ClusterSpec, Node
from bksim.chaos.proxy import TcpProxy
from bksim.chaos.scenarios import SCENARIOS, Step, plan as make_plan
from bksim.chaos.workload import TOPIC, LedgerWriter, Recorder, TopicWorkload, run_writers
from bksim.ledger.quorum import write_set_indexes

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
REFUSAL_TIMEOUT_S = 30.0  # a bookie started on wiped directories must exit within this
FENCED_TIMEOUT_S = 30.0
TAKEOVER_TIMEOUT_S = 30.0  # a paused broker's session expires, and another broker takes its topic, within this  # a resumed broker must answer NOT_OWNER for the topic within this
STOP_TIMEOUT_S = 15.0  # SIGTERM of a bookie before its entry log is damaged
READ_ONLY_TIMEOUT_S = 20.0  # a bookie whose disk filled (or drained) re-registers within this
DISK_FULL_FRACTION = 0.98  # the balloon fills the ledger disk this far (disk_usage_threshold is 0.95)
SMALL_DISK_MB = 64
FORMAT_TIMEOUT_S = 60.0


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
        self.writers: list[LedgerWriter] = []
        self.held_links: list[tuple[str, TcpProxy]] = []  # the links a link fault holds or delays now
        self.lost_copies: dict[str, set[tuple[int, int]]] = {}  # bookie id -> entry copies a truncation removed
        self.wiped: set[str] = set()  # ids of bookies whose directories were wiped (and re-initialised)
        self.flips: list[tuple[Node, disk.Flip]] = []  # entry log bytes flipped, checked after the workload
        self.failed_checks: list[str] = []  # a fault's own check failed (a violation)

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
        if step.target == "owner-bookie-link":
            return [self._owner(), self.rng.choice(self.cluster.bookies)]
        if step.target == "bookie-links":  # another bookie than the last fault's, when there is one
            return [self.rng.choice([b for b in self.cluster.bookies if b not in self.victims] or self.cluster.bookies)]
        if step.target == "small-disk-bookie":
            return [self.cluster.node(n) for n in sorted(self.cluster.spec.small_ledger_disk)]
        raise ChaosError(f"unknown step target {step.target!r}")

    # -- steps --------------------------------------------------------------------------------------------
    def apply(self, step: Step) -> None:
        rec = self.recorder
        victims = self._targets(step)
        names = ", ".join(v.name for v in victims) or "zookeeper"
        t = rec.now()
        handler = getattr(self, "_do_" + step.action.replace("-", "_"), None)
        if handler is None:
            raise ChaosError(f"unknown step action {step.action!r}")
        handler(step, victims)
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

    # -- process faults -----------------------------------------------------------------------------------
    def _kill(self, v: Node) -> None:
        pid = v.pid
        self.cluster.kill9(v)
        self.recorder.event("fault", f"kill -9 {v.name} (pid {pid})")

    def _do_kill9(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            self._kill(v)

    def _do_kill9_tear(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            self._kill(v)
            what = disk.tear_journal(os.path.join(v.home, "journal"), self.rng)
            self.recorder.event("fault", f"{v.name}: {what}")
            if what.startswith("tore "):
                self._expect_torn(v)

    def _do_kill9_truncate(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            self._kill(v)
            what, removed = disk.truncate_journal(os.path.join(v.home, "journal"), self.rng)
            self.recorder.event("fault", f"{v.name}: {what}")
            if what.startswith("truncated "):
                self._expect_torn(v)
                self.lost_copies.setdefault(v.node_id, set()).update(removed)

    def _expect_torn(self, v: Node) -> None:
        v.torn_pending = True
        self.log_marks[v.name] = os.path.getsize(v.log_path)

    def _do_kill9_wipe(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            self._kill(v)
            self.recorder.event("fault", f"{v.name}: {wipe.wipe_bookie(v.home)}")
            self.wiped.add(v.node_id)

    def _do_pause(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            self.cluster.pause(v)
            self.recorder.event("fault", f"SIGSTOP {v.name} (pid {v.pid})")
            if v.kind == "broker":
                self._take_over_from(v)

    def _take_over_from(self, paused: Node) -> None:
        """What a client does when the owner stops answering: once the paused broker's session has expired (its
        registration is gone), ask another broker for the topic, which makes that broker take it over (fence the
        paused one's ledger). The producer itself would wait for its send timeout (60 s) on the silent stream."""
        rec = self.recorder
        t = time.monotonic()
        expired = self.cluster.wait_registration(paused, lambda doc: doc is None, TAKEOVER_TIMEOUT_S)
        if expired is None:
            self.failed_checks.append(f"{paused.name}'s registration outlived its session by {TAKEOVER_TIMEOUT_S:.0f} s")
            return
        rec.event("fault", f"{paused.name}'s ZooKeeper session expired", seconds=round(expired, 3))
        others = [b.address for b in self.cluster.brokers if b is not paused and b.alive() and not b.paused]
        taken, detail = check.load_topic(others, TOPIC, TAKEOVER_TIMEOUT_S)
        if taken:
            rec.event("recovered", f"topic taken over by {detail}", seconds=round(time.monotonic() - t, 3))
        else:
            self.failed_checks.append(f"no broker took the topic over from paused {paused.name}: {detail}")

    def _do_restart(self, step: Step, victims: list[Node]) -> None:
        rec = self.recorder
        for v in victims:
            self.cluster.spawn(v)
            rec.event("heal", f"restart {v.name} (pid {v.pid})")
        for v in victims:
            waited = self.cluster.wait_registered(v)
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

    def _do_reformat_restart(self, step: Step, victims: list[Node]) -> None:
        """A wiped bookie must refuse to start; the operator re-initialises it; it starts as a new bookie."""
        cluster, rec = self.cluster, self.recorder
        for v in victims:
            mark = os.path.getsize(v.log_path)
            cluster.spawn(v)
            status = processes.wait_status(v.pid, REFUSAL_TIMEOUT_S)
            with open(v.log_path, "rb") as f:
                f.seek(mark)
                said = f.read().decode(errors="replace")
            if status is None:
                cluster.kill9(v)
                self.failed_checks.append(f"{v.name} started on wiped directories (it had to refuse)")
            else:
                v.pid = None
                reason = next((line.strip() for line in said.splitlines() if "wiped" in line), "")
                if status == 0 or not reason:
                    self.failed_checks.append(f"{v.name} on wiped directories exited {status} without saying why:\n"
                                         f"{said[-600:]}")
                rec.event("recovered", f"{v.name} refused to start on wiped directories (exit {status}): "
                                       f"{reason[:160]}")
            done = format_bookie(v, cluster.run_dir)
            rec.event("heal", f"operator: bksim bookie format --delete-cookie --force on {v.name}: {done}")
            cluster.spawn(v)
            rec.event("heal", f"restart {v.name} as a new bookie (pid {v.pid})")
            waited = cluster.wait_registered(v)
            rec.event("recovered", f"{v.name} registered as a new bookie", seconds=round(waited, 3))

    def _do_resume(self, step: Step, victims: list[Node]) -> None:
        cluster, rec = self.cluster, self.recorder
        for v in victims:
            cluster.resume(v)
            rec.event("heal", f"SIGCONT {v.name} (pid {v.pid})")
        for v in victims:
            waited = cluster.wait_registered(v)
            rec.event("recovered", f"{v.name} registered (again) after the pause", seconds=round(waited, 3))
            if v.kind == "broker":
                fenced, detail = check.broker_fenced(v.address, TOPIC, FENCED_TIMEOUT_S)
                if fenced:
                    rec.event("recovered", f"{v.name} came back fenced: {detail}")
                else:
                    self.failed_checks.append(f"paused broker not fenced: {v.name} {detail}")

    # -- ZooKeeper ----------------------------------------------------------------------------------------
    def _do_zk_stop_start(self, step: Step, victims: list[Node]) -> None:
        cluster, rec = self.cluster, self.recorder
        rec.event("fault", f"stop ZooKeeper (pid {cluster.zookeeper.pid}) for {step.down_s:.1f} s")
        cluster.restart_zookeeper(step.down_s)
        rec.event("heal", f"ZooKeeper serving again (pid {cluster.zookeeper.pid})")
        for node in cluster.bookies + cluster.brokers:
            waited = cluster.wait_registered(node)
            rec.event("recovered", f"{node.name} registered after the ZooKeeper restart", seconds=round(waited, 3))

    def _do_zk_cut(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            self.cluster.proxies[v.name].block()
            self.recorder.event("fault", f"cut {v.name} off from ZooKeeper (proxy {self.cluster.proxies[v.name].address})")

    def _do_zk_heal(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            self.cluster.proxies[v.name].unblock()
            self.recorder.event("heal", f"reconnect {v.name} to ZooKeeper")
        for v in victims:
            waited = self.cluster.wait_registered(v)
            self.recorder.event("recovered", f"{v.name} registered again", seconds=round(waited, 3))

    # -- broker<->bookie links ----------------------------------------------------------------------------
    def _links_of(self, step: Step, victims: list[Node]) -> list[tuple[str, TcpProxy]]:
        if step.target == "owner-bookie-link":
            broker, bookie = victims
            return [(f"{broker.name}<->{bookie.name}", self.cluster.links[(broker.name, bookie.name)])]
        (bookie,) = victims
        return [(f"{b}<->{k}", p) for (b, k), p in sorted(self.cluster.links.items()) if k == bookie.name]

    def _do_link_hold(self, step: Step, victims: list[Node]) -> None:
        up, down = {"up": (True, False), "down": (False, True), "both": (True, True)}[step.arg]
        what = {"both": "blackhole", "up": "one-way loss of the requests (broker->bookie)",
                "down": "one-way loss of the replies (bookie->broker)"}[step.arg]
        self.held_links = self._links_of(step, victims)
        for _, proxy in self.held_links:
            proxy.hold(up=up, down=down)
        self.recorder.event("fault", f"{what} on {', '.join(n for n, _ in self.held_links)}")

    def _do_link_delay(self, step: Step, victims: list[Node]) -> None:
        self.held_links = self._links_of(step, victims)
        for _, proxy in self.held_links:
            proxy.delay(float(step.arg))
        self.recorder.event("fault", f"delay {step.arg} ms on {', '.join(n for n, _ in self.held_links)}")

    def _do_link_heal(self, step: Step, victims: list[Node]) -> None:
        for _, proxy in self.held_links:
            proxy.heal()
        self.recorder.event("heal", f"links healed: {', '.join(n for n, _ in self.held_links)}")
        self.held_links = []

    # -- disks --------------------------------------------------------------------------------------------
    def _do_stop_flip(self, step: Step, victims: list[Node]) -> None:
        rec = self.recorder
        for v in victims:
            pid = v.pid
            if not processes.stop(pid, STOP_TIMEOUT_S):
                raise ChaosError(f"{v.name} (pid {pid}) did not stop within {STOP_TIMEOUT_S:.0f} s")
            v.pid = None
            rec.event("fault", f"stop {v.name} (SIGTERM, pid {pid}): its write cache goes to its entry logs")
            first_asked = self._first_replica_picker(v.node_id)
            what, flip = disk.flip_entry_log_byte(os.path.join(v.home, "ledgers"), self.rng, first_asked)
            rec.event("fault", f"{v.name}: {what}")
            if flip is None:
                self.failed_checks.append(f"{v.name}: {what}")
            else:
                self.flips.append((v, flip))

    def _first_replica_picker(self, bookie_id: str):
        """(ledger, entry) -> True for the writers' acknowledged entries whose read asks `bookie_id` first."""
        acked = {r.ledger_id: set(r.acked) for w in self.writers for r in w.ledgers}
        infos = asyncio.run(check.ledger_infos(list(acked), self.cluster.live_broker_addresses()))

        def pick(ledger_id: int, entry_id: int) -> bool:
            info = infos.get(ledger_id)
            if info is None or entry_id not in acked.get(ledger_id, ()):
                return False
            ensemble = next(s.ensemble for s in reversed(info.segments) if s.first_entry_id <= entry_id)
            return ensemble[write_set_indexes(entry_id, len(ensemble), info.write_quorum_size)[0]] == bookie_id
        return pick

    def _do_disk_fill(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            what = disk.fill_disk(self.cluster.ledger_dir_seen_by(v), DISK_FULL_FRACTION)
            self.recorder.event("fault", f"{v.name} ledger disk: {what}")
            self._wait_read_only(v, True)

    def _do_disk_drain(self, step: Step, victims: list[Node]) -> None:
        for v in victims:
            self.recorder.event("heal", f"{v.name} ledger disk: {disk.drain_disk(self.cluster.ledger_dir_seen_by(v))}")
            self._wait_read_only(v, False)

    def _wait_read_only(self, v: Node, read_only: bool) -> None:
        state = "read-only" if read_only else "writable"
        waited = self.cluster.wait_registration(v, lambda doc: doc is not None and doc["read_only"] == read_only,
                                                READ_ONLY_TIMEOUT_S)
        if waited is None:
            self.failed_checks.append(f"{v.name} not registered {state} within {READ_ONLY_TIMEOUT_S:.0f} s")
        else:
            self.recorder.event("fault" if read_only else "recovered", f"{v.name} registered {state}",
                                seconds=round(waited, 3))

    def _check_flip(self, v: Node, flip: disk.Flip, brokers: list[str]) -> dict:
        """The damaged copy is still served (not "no entry") and fails its digest; a broker read returns the
        acknowledged bytes, so the reader failed over."""
        out = {"bookie": v.name, "ledger_id": flip.ledger_id, "entry_id": flip.entry_id}
        problems = check.check_flip(v.address, brokers, flip)
        out["problems"] = problems
        self.failed_checks.extend(f"entrylog flip {flip.ledger_id}:{flip.entry_id} on {v.name}: {p}" for p in problems)
        if not problems:
            self.recorder.event("check", f"{v.name} serves {flip.ledger_id}:{flip.entry_id} with a bad digest; "
                                         f"the brokers read the acknowledged bytes (failed over)")
        return out

    def _judge_audit(self, out_dir: str) -> dict:
        """Wiped or truncated bookies lost copies on purpose: the audit must report those and nothing else."""
        try:
            with open(os.path.join(out_dir, "report.json")) as f:
                audit_report = json.load(f)
        except (OSError, ValueError) as e:
            return {"problems": [f"no audit report.json to judge: {e}"], "figures": {}}
        if self.wiped:
            (wiped,) = self.wiped  # one wipe per run
            problems, figures = wipe.judge_audit(audit_report, wiped)
            expected = f"the copies of wiped bookie {wiped}"
        else:
            problems, figures = check.judge_truncation(audit_report, self.lost_copies)
            expected = f"the copies the truncation removed on {', '.join(sorted(self.lost_copies))}"
        return {"problems": problems, "figures": figures, "expected": expected}

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
        for (broker, bookie), proxy in cluster.links.items():
            if proxy.state() != "ok":
                done.append(f"healed the link {broker}<->{bookie} ({proxy.state()})")
                proxy.heal()
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
        small = {}
        if any(s.target == "small-disk-bookie" for s in self.steps):
            small = {f"bookie-{self.rng.randint(1, 3)}": SMALL_DISK_MB}
        spec = ClusterSpec(child_env=dict(CHILD_ENV), bookie_links=SCENARIOS[self.scenario].links,
                           small_ledger_disk=small)
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
            self.writers = writers
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
                reasons = collections.Counter(failed.values())
                topic_counts["failed_send_reasons"] = [{"reason": r, "sends": n} for r, n in reasons.most_common(3)]
                report["entrylog_flips"] = [self._check_flip(v, flip, addresses) for v, flip in self.flips]
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
            if self.wiped or self.lost_copies:
                report["audit"]["judged"] = self._judge_audit(os.path.join(self.run_dir, "audit"))
        report["failed_checks"] = self.failed_checks
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


def format_bookie(node: Node, cwd: str) -> str:
    """The operator's re-initialisation of a wiped bookie: `bksim bookie format --delete-cookie --force` with the
    bookie's own configuration (its environment); ChaosError if it fails."""
    argv = [sys.executable, "-m", "bksim.cli.main", "bookie", "format", "--delete-cookie", "--force"]
    try:
        done = subprocess.run(argv, cwd=cwd, env=node.env, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ChaosError(f"bksim bookie format for {node.name} did not finish in {FORMAT_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        raise ChaosError(f"bksim bookie format for {node.name} failed (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout)[-600:]}")
    return " ".join(done.stdout.split())[:200]


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
    judged = audit.get("judged")
    if judged is not None and audit.get("verdict") in ("clean", "violations"):
        out.extend(f"audit: {p}" for p in judged["problems"])
    elif audit.get("verdict") != "clean":
        out.append(f"audit: {audit.get('verdict')} (exit {audit.get('exit_status')})")
    out.extend(p for p in report.get("problems", []) if p.startswith("unexpected exit") or "torn tail" in p)
    out.extend(report.get("failed_checks", []))
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
            "audit": _audit_column(report.get("audit", {})),
            "recovery_s": report.get("recovery", {}).get("max_s"),
            "elapsed_s": report.get("elapsed_s"), "run_dir": report["run_dir"],
            "violations": report.get("violations", [])}


def _audit_column(audit: dict) -> str:
    """clean; or, where copies were destroyed on purpose, whether the audit reported exactly those."""
    judged = audit.get("judged")
    if judged is None or audit.get("verdict") not in ("clean", "violations"):
        return audit.get("verdict", "not run")
    return "unexpected findings" if judged["problems"] else "lost copies reported"


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
