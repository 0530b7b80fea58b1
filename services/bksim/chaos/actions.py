"""The steps of a chaos run: who a step hits (TARGETS) and what it does to them (ACTIONS), each table keyed by
the scenario's step type (scenarios.StepTarget, scenarios.StepAction) and complete for it (checked at import).

`apply(state, step)` picks the victims, runs the step's action and keeps the fault list (a fault's injection
time, its victims, when the next healing step ended it). An action is a function `(state, step, victims)`; it
records what it did on the timeline (state.recorder), waits for what it caused within its own bound (a
restarted process registered again, a paused broker's topic taken over, a full disk registered read-only), and
leaves for the checks what they must look at (torn journals, removed copies, a wiped bookie, flipped bytes).
A fault's own check that fails is a violation (state.failed_checks); something odd that is not is a problem
(state.problems).

`heal_all(state)` heals whatever the schedule left broken (it should be nothing) before the checks.

Processes are touched only through the cluster object (kill -9, SIGSTOP/SIGCONT, spawn, all by pid) and
`processes.stop` / `processes.wait_status` by pid; the only child process an action starts itself is the
operator's `bksim bookie format` (bounded by FORMAT_TIMEOUT_S).
"""
from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from bksim.adapters import processes
from bksim.adapters.zookeeper_server import ZooKeeperServer
from bksim.chaos import check, disk, replicas, wipe
from bksim.chaos.cluster import ChaosCluster, Node
from bksim.chaos.proxy import TcpProxy
from bksim.chaos.scenarios import Step, StepAction, StepTarget
from bksim.chaos.workload import TOPIC, LedgerWriter, Recorder, TopicWorkload
from bksim.formats import entry_log as entry_log_fmt
from bksim.ledger.quorum import write_set_indexes
from bksim.model.errors import BksimError

REFUSAL_TIMEOUT_S = 30.0  # a bookie started on wiped directories must exit within this
FENCED_TIMEOUT_S = 30.0  # a resumed broker must answer NOT_OWNER for the topic within this
TAKEOVER_TIMEOUT_S = 30.0  # a paused broker's session expires, and another broker takes its topic, within this
STOP_TIMEOUT_S = 15.0  # SIGTERM of a bookie before its entry log is damaged
READ_ONLY_TIMEOUT_S = 20.0  # a bookie whose disk filled (or drained) re-registers within this
DISK_FULL_FRACTION = 0.98  # the balloon fills the ledger disk this far (disk_usage_threshold is 0.95)
FORMAT_TIMEOUT_S = 60.0
REGISTRATION_GONE_TIMEOUT_S = 30.0  # a killed bookie's registration goes with its ZooKeeper session within this
REREPLICATION_TIMEOUT_S = 60.0  # autorecovery restores every closed ledger after a loss or damage within this
HEAL_TIMEOUT_S = 60.0
ELECTION_TIMEOUT_S = 30.0  # the ZooKeeper servers left with a quorum elect a leader within this
QUORUM_GONE_TIMEOUT_S = 30.0  # a ZooKeeper server left without a quorum stops serving within this
SINGLE_OWNER_TIMEOUT_S = 30.0  # after a ZooKeeper outage, one broker serves the topic and the others refuse it
COMPACTING_WAIT_S = 5.0  # how long a compacting-bookie target waits for a compaction to be under way somewhere
FAULT_MARGIN_S = 1.0  # verify-gc: a ledger counts as away from faults if closed this long before one started
VERIFY_AFTER_HEAL_S = 3.0  # verify-gc runs no sooner than this after the last heal (new ledgers away from faults)


class ChaosError(BksimError):
    """A run could not be carried out (not a violation: the cluster could not start, a step failed)."""


@dataclass
class RunState:
    """What the steps of one run share: the cluster and workload they act on, the seeded choice of victims,
    and what the faults leave for the checks and the report."""
    cluster: ChaosCluster
    recorder: Recorder
    topic: TopicWorkload
    writers: list[LedgerWriter]
    rng: random.Random  # picks victims (seeded by scenario and seed)
    problems: list[str]  # things that went wrong in the run itself
    failed_checks: list[str]  # a fault's own check failed (a violation)
    victims: list[Node] = field(default_factory=list)  # the last step's (StepTarget.SAME)
    faults: list[dict] = field(default_factory=list)  # {"action", "t", "victims", "healed_t"}
    log_marks: dict[str, int] = field(default_factory=dict)  # node name -> its log's size when its journal was torn
    held_links: list[tuple[str, TcpProxy]] = field(default_factory=list)  # links a link fault holds or delays now
    lost_copies: dict[str, set[tuple[int, int]]] = field(default_factory=dict)  # bookie id -> copies truncated away
    wiped: set[str] = field(default_factory=set)  # ids of bookies whose directories were wiped (and re-initialised)
    flips: list[tuple[Node, disk.Flip]] = field(default_factory=list)  # entry log bytes flipped, checked at the end
    lost: dict[str, float] = field(default_factory=dict)  # ids of bookies lost for good -> when (recorder time)
    repair: bool = False  # autorecovery repairs what the faults destroyed: the end must find Qw identical copies
    rereplication: list[dict] = field(default_factory=list)  # {"bookie", "cause", "t", "rereplication_s", ...}
    # (bookie, compaction file on its disk when it was killed, its log's size then): its start-up must deal with it
    compaction_kills: list[tuple[Node, str, int]] = field(default_factory=list)
    zk_victims: list[ZooKeeperServer] = field(default_factory=list)  # the ZooKeeper servers a zk-kill9 took


Action = Callable[[RunState, Step, list[Node]], None]
TargetRule = Callable[[RunState], list[Node]]


def apply(state: RunState, step: Step) -> None:
    """Run one step: choose its victims, act, and keep the fault list (a healing step ends the newest open
    fault)."""
    rec = state.recorder
    victims = TARGETS[step.target](state)
    zk_step = step.action in (StepAction.ZK_KILL9, StepAction.ZK_START)
    names = (", ".join(v.name for v in victims) or (zk_step and ", ".join(z.name for z in state.zk_victims))
             or "zookeeper")
    t = rec.now()
    ACTIONS[step.action](state, step, victims)
    if step.fault:
        state.faults.append({"action": step.action.value, "t": round(t, 3), "victims": names})
    else:
        for f in reversed(state.faults):
            if "healed_t" not in f:
                f["healed_t"] = round(rec.now(), 3)
                break
    if step.target != StepTarget.SAME:
        state.victims = victims
    if not step.fault and state.topic.client is not None:
        try:
            rec.event("note", f"topic owner now {state.topic.client.lookup(TOPIC)['broker_id']}")
        except Exception as e:  # noqa: BLE001 - a note only
            rec.event("note", f"topic lookup failed: {type(e).__name__}: {str(e)[:120]}")


# ------------------------------------------------------------------------------------------------ targets
def _live_bookies(state: RunState) -> list[Node]:
    return [b for b in state.cluster.bookies if b.alive() and not b.paused]


def _owner(state: RunState) -> Node:
    """The broker that owns the workload's topic now (a random live broker when the lookup fails)."""
    brokers = state.cluster.brokers
    try:
        broker_id = state.topic.client.lookup(TOPIC)["broker_id"]
        for b in brokers:
            if b.node_id == broker_id and b.alive():
                return b
    except Exception as e:  # noqa: BLE001 - fall back to a live broker, and say so
        state.recorder.event("note", f"lookup of the topic owner failed ({type(e).__name__}); a random broker")
    live = [b for b in brokers if b.alive() and not b.paused]
    return state.rng.choice(live or brokers)


def _other_bookie(state: RunState) -> list[Node]:
    """Another bookie than the last fault's, when there is one."""
    bookies = state.cluster.bookies
    return [state.rng.choice([b for b in bookies if b not in state.victims] or bookies)]


def _compaction_files(v: Node) -> list[str]:
    try:
        names = os.listdir(os.path.join(v.ledger_dir, "entrylogs"))
    except FileNotFoundError:
        return []
    return sorted(n for n in names if entry_log_fmt.parse_compaction_file_name(n) is not None)


def _compacting_bookie(state: RunState) -> list[Node]:
    """A live bookie with a compaction file in its entry-log directory (polled up to COMPACTING_WAIT_S), else a
    random live bookie; the file seen is kept for verify-gc (its start-up must finish or delete it)."""
    deadline = time.monotonic() + COMPACTING_WAIT_S
    while True:
        live = _live_bookies(state)
        busy = [(v, files) for v in live if (files := _compaction_files(v))]
        if busy:
            v, files = state.rng.choice(busy)
            state.recorder.event("note", f"{v.name} is compacting: {', '.join(files)}")
            return [v]
        if time.monotonic() >= deadline:
            state.recorder.event("note", f"no bookie compacting within {COMPACTING_WAIT_S:.0f} s: a random one")
            return [state.rng.choice(live)]
        time.sleep(0.02)  # polling the entry-log directories: a compaction starts at a GC round


def _running_servers(state: RunState) -> list[ZooKeeperServer]:
    return [z for z in state.cluster.zookeepers if z.pid is not None]


def _leader(state: RunState) -> ZooKeeperServer:
    return _wait_for(state.cluster.zookeeper_leader, ELECTION_TIMEOUT_S, "a ZooKeeper leader")


def _wait_for(predicate, timeout_s: float, what: str):
    """Poll `predicate` until it returns something truthy (returned); ChaosError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise ChaosError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.05)  # polling the servers' own answers (srvr)
    return value


def _zookeeper_target(choose) -> TargetRule:
    """A ZooKeeper target: `choose(state)` picks servers, kept in state.zk_victims (no bookie or broker)."""
    def rule(state: RunState) -> list[Node]:
        state.zk_victims = choose(state)
        return []
    return rule


def _followers(state: RunState) -> list[ZooKeeperServer]:
    leader = _leader(state)
    return [state.rng.choice([z for z in _running_servers(state) if z is not leader])]


def _majority(state: RunState) -> list[ZooKeeperServer]:
    return state.rng.sample(_running_servers(state), len(state.cluster.zookeepers) // 2 + 1)


TARGETS: dict[StepTarget, TargetRule] = {
    StepTarget.SAME: lambda state: list(state.victims),
    StepTarget.RANDOM_BOOKIE: lambda state: [state.rng.choice(_live_bookies(state))],
    StepTarget.TWO_BOOKIES: lambda state: state.rng.sample(_live_bookies(state), 2),
    StepTarget.TOPIC_OWNER: lambda state: [_owner(state)],
    StepTarget.ZOOKEEPER: lambda state: [],
    StepTarget.ZOOKEEPER_FOLLOWER: _zookeeper_target(_followers),
    StepTarget.ZOOKEEPER_LEADER: _zookeeper_target(lambda state: [_leader(state)]),
    StepTarget.ZOOKEEPER_MAJORITY: _zookeeper_target(_majority),
    StepTarget.OWNER_BOOKIE_LINK: lambda state: [_owner(state), state.rng.choice(state.cluster.bookies)],
    StepTarget.BOOKIE_LINKS: _other_bookie,
    StepTarget.SMALL_DISK_BOOKIE: lambda state: [state.cluster.node(n)
                                                 for n in sorted(state.cluster.spec.small_ledger_disk)],
    StepTarget.COMPACTING_BOOKIE: _compacting_bookie,
    StepTarget.ALL_BOOKIES: lambda state: list(state.cluster.bookies),
}


# ------------------------------------------------------------------------------------------------ processes
def _kill(state: RunState, v: Node) -> None:
    pid = v.pid
    state.cluster.kill9(v)
    state.recorder.event("fault", f"kill -9 {v.name} (pid {pid})")


def _expect_torn(state: RunState, v: Node) -> None:
    v.torn_pending = True
    state.log_marks[v.name] = os.path.getsize(v.log_path)


def kill9(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        _kill(state, v)
        files = _compaction_files(v)
        if files and step.target == StepTarget.COMPACTING_BOOKIE:
            mark = os.path.getsize(v.log_path)
            state.compaction_kills += [(v, name, mark) for name in files]
            state.recorder.event("fault", f"{v.name} killed during compaction: {', '.join(files)} on disk")


def kill9_tear(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        _kill(state, v)
        what = disk.tear_journal(os.path.join(v.home, "journal"), state.rng)
        state.recorder.event("fault", f"{v.name}: {what}")
        if what.startswith("tore "):
            _expect_torn(state, v)


def kill9_truncate(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        _kill(state, v)
        what, removed = disk.truncate_journal(os.path.join(v.home, "journal"), state.rng)
        state.recorder.event("fault", f"{v.name}: {what}")
        if what.startswith("truncated "):
            _expect_torn(state, v)
            state.lost_copies.setdefault(v.node_id, set()).update(removed)


def kill9_lost(state: RunState, step: Step, victims: list[Node]) -> None:
    """kill -9 and never restart: the bookie is lost for good (its disk with it); autorecovery must replace it."""
    for v in victims:
        _kill(state, v)
        state.lost[v.node_id] = state.recorder.now()
        state.repair = True
        state.recorder.event("fault", f"{v.name} lost for good ({v.node_id}): never restarted")


def await_rereplication(state: RunState, step: Step, victims: list[Node]) -> None:
    """Wait (bounded) until the lost bookie's registration has expired with its session (only then can the
    auditor count it lost), then until no closed ledger names a lost bookie and no closed ledger is marked."""
    for v in victims:
        gone = state.cluster.wait_registration(v, lambda doc: doc is None, TAKEOVER_TIMEOUT_S)
        if gone is None:
            state.failed_checks.append(f"{v.name}'s registration outlived its session by {TAKEOVER_TIMEOUT_S:.0f} s")
            continue
        state.recorder.event("note", f"{v.name}'s ZooKeeper session expired: unregistered", seconds=round(gone, 3))
        _wait_replicated(state, v, "loss", state.lost.get(v.node_id, state.recorder.now()))


def _wait_replicated(state: RunState, v: Node, cause: str, since_t: float) -> None:
    rec = state.recorder
    since = time.monotonic() - (rec.now() - since_t)
    with replicas.ReplicaWatch(state.cluster) as watch:
        seconds, left = watch.wait_replicated(set(state.lost), since, REREPLICATION_TIMEOUT_S)
    entry = {"bookie": v.name, "bookie_id": v.node_id, "cause": cause, "t": round(since_t, 3),
             "rereplication_s": None if seconds is None else round(seconds, 3)}
    state.rereplication.append(entry)
    if seconds is None:
        state.failed_checks.append(f"autorecovery did not restore every closed ledger within "
                                   f"{REREPLICATION_TIMEOUT_S:.0f} s of the {cause} of {v.name}: {left}")
    else:
        rec.event("recovered", f"every closed ledger fully replicated after the {cause} of {v.name}",
                  seconds=round(seconds, 3))


def check_all_repair(state: RunState, step: Step, victims: list[Node]) -> None:
    """The operator asks for the check of all ledgers; autorecovery must replace the damaged copies."""
    state.repair = True
    for v in victims:
        damaged_t = next((f["t"] for f in reversed(state.faults) if v.name in f["victims"]), state.recorder.now())
        requested_ms, said = replicas.request_check_all(v, state.cluster.run_dir)
        state.recorder.event("heal", f"operator: bksim autorecovery check-all: {said}")
        with replicas.ReplicaWatch(state.cluster) as watch:
            ran = watch.wait_check_all_ran(requested_ms, REREPLICATION_TIMEOUT_S)
        if ran is None:
            state.failed_checks.append(f"the auditor did not run the requested check of all ledgers within "
                                       f"{REREPLICATION_TIMEOUT_S:.0f} s")
            continue
        state.recorder.event("recovered", "the auditor ran the check of all ledgers", seconds=round(ran, 3))
        _wait_replicated(state, v, "damage", damaged_t)


def kill9_wipe(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        _kill(state, v)
        state.recorder.event("fault", f"{v.name}: {wipe.wipe_bookie(v.home)}")
        state.wiped.add(v.node_id)


def pause(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        state.cluster.pause(v)
        state.recorder.event("fault", f"SIGSTOP {v.name} (pid {v.pid})")
        if v.kind == "broker":
            _take_over_from(state, v)


def _take_over_from(state: RunState, paused: Node) -> None:
    """What a client does when the owner stops answering: once the paused broker's session has expired (its
    registration is gone), ask another broker for the topic, which makes that broker take it over (fence the
    paused one's ledger). The producer itself would wait for its send timeout (60 s) on the silent stream."""
    cluster, rec = state.cluster, state.recorder
    t = time.monotonic()
    expired = cluster.wait_registration(paused, lambda doc: doc is None, TAKEOVER_TIMEOUT_S)
    if expired is None:
        state.failed_checks.append(f"{paused.name}'s registration outlived its session by {TAKEOVER_TIMEOUT_S:.0f} s")
        return
    rec.event("fault", f"{paused.name}'s ZooKeeper session expired", seconds=round(expired, 3))
    others = [b.address for b in cluster.brokers if b is not paused and b.alive() and not b.paused]
    taken, detail = check.load_topic(others, TOPIC, TAKEOVER_TIMEOUT_S, state.cluster.credentials)
    if taken:
        rec.event("recovered", f"topic taken over by {detail}", seconds=round(time.monotonic() - t, 3))
    else:
        state.failed_checks.append(f"no broker took the topic over from paused {paused.name}: {detail}")


def restart(state: RunState, step: Step, victims: list[Node]) -> None:
    cluster, rec = state.cluster, state.recorder
    for v in victims:
        cluster.spawn(v)
        rec.event("heal", f"restart {v.name} (pid {v.pid})")
    for v in victims:
        waited = cluster.wait_registered(v)
        rec.event("recovered", f"{v.name} registered again", seconds=round(waited, 3))
        if v.torn_pending:
            v.torn_pending = False
            with open(v.log_path, "rb") as f:
                f.seek(state.log_marks.get(v.name, 0))
                replay_log = f.read().decode(errors="replace")
            if "torn" in replay_log:
                rec.event("recovered", f"{v.name}: journal replay truncated the torn tail")
            else:
                state.problems.append(f"{v.name}: no torn tail reported by journal replay after the tear")


def reformat_restart(state: RunState, step: Step, victims: list[Node]) -> None:
    """A wiped bookie must refuse to start; the operator re-initialises it; it starts as a new bookie."""
    cluster, rec = state.cluster, state.recorder
    for v in victims:
        mark = os.path.getsize(v.log_path)
        cluster.spawn(v)
        status = processes.wait_status(v.pid, REFUSAL_TIMEOUT_S)
        with open(v.log_path, "rb") as f:
            f.seek(mark)
            said = f.read().decode(errors="replace")
        if status is None:
            cluster.kill9(v)
            state.failed_checks.append(f"{v.name} started on wiped directories (it had to refuse)")
        else:
            v.pid = None
            reason = next((line.strip() for line in said.splitlines() if "wiped" in line), "")
            if status == 0 or not reason:
                state.failed_checks.append(f"{v.name} on wiped directories exited {status} without saying why:\n"
                                           f"{said[-600:]}")
            rec.event("recovered", f"{v.name} refused to start on wiped directories (exit {status}): "
                                   f"{reason[:160]}")
        # `bookie format` refuses a bookie still registered, and the killed one stays so until its session expires
        gone = cluster.wait_registration(v, lambda doc: doc is None, REGISTRATION_GONE_TIMEOUT_S)
        if gone is None:
            state.failed_checks.append(f"{v.name}'s registration outlived its killed process by "
                                       f"{REGISTRATION_GONE_TIMEOUT_S:.0f} s")
            continue
        rec.event("recovered", f"{v.name}'s registration expired with its session", seconds=round(gone, 3))
        done = format_bookie(v, cluster.run_dir)
        rec.event("heal", f"operator: bksim bookie format --delete-cookie --force on {v.name}: {done}")
        cluster.spawn(v)
        rec.event("heal", f"restart {v.name} as a new bookie (pid {v.pid})")
        waited = cluster.wait_registered(v)
        rec.event("recovered", f"{v.name} registered as a new bookie", seconds=round(waited, 3))


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


def resume(state: RunState, step: Step, victims: list[Node]) -> None:
    cluster, rec = state.cluster, state.recorder
    for v in victims:
        cluster.resume(v)
        rec.event("heal", f"SIGCONT {v.name} (pid {v.pid})")
    for v in victims:
        waited = cluster.wait_registered(v)
        rec.event("recovered", f"{v.name} registered (again) after the pause", seconds=round(waited, 3))
        if v.kind == "broker":
            fenced, detail = check.broker_fenced(v.address, TOPIC, FENCED_TIMEOUT_S, state.cluster.credentials)
            if fenced:
                rec.event("recovered", f"{v.name} came back fenced: {detail}")
            else:
                state.failed_checks.append(f"paused broker not fenced: {v.name} {detail}")


# ------------------------------------------------------------------------------------------------ ZooKeeper
def zk_stop_start(state: RunState, step: Step, victims: list[Node]) -> None:
    cluster, rec = state.cluster, state.recorder
    rec.event("fault", f"stop ZooKeeper (pid {cluster.zookeeper.pid}) for {step.down_s:.1f} s")
    cluster.restart_zookeeper(step.down_s)
    rec.event("heal", f"ZooKeeper serving again (pid {cluster.zookeeper.pid})")
    for node in cluster.bookies + cluster.brokers:
        waited = cluster.wait_registered(node)
        rec.event("recovered", f"{node.name} registered after the ZooKeeper restart", seconds=round(waited, 3))


def zk_kill9(state: RunState, step: Step, victims: list[Node]) -> None:
    """kill -9 the chosen servers; then the rest either elect a leader (timed) or, left without a quorum, stop
    serving (timed; one that still serves after QUORUM_GONE_TIMEOUT_S is a problem)."""
    cluster, rec = state.cluster, state.recorder
    for z in state.zk_victims:
        mode = z.mode() or "not serving"
        pid = cluster.stop_zookeeper_server(z, kill=True)
        rec.event("fault", f"kill -9 {z.name} ({mode}, pid {pid})")
    t = time.monotonic()
    rest = _running_servers(state)
    if 2 * len(rest) > len(cluster.zookeepers):
        leader = _leader(state)
        rec.event("recovered", f"{leader.name} leads the {len(rest)} servers left", seconds=round(time.monotonic() - t, 3))
        return
    try:
        _wait_for(lambda: all(z.mode() == "" for z in rest), QUORUM_GONE_TIMEOUT_S, "end of service without a quorum")
        rec.event("note", f"no quorum: {', '.join(z.name for z in rest)} stopped serving",
                  seconds=round(time.monotonic() - t, 3))
    except ChaosError as e:
        state.problems.append(f"{', '.join(z.name for z in rest)} without a quorum: {e}")


def zk_start(state: RunState, step: Step, victims: list[Node]) -> None:
    """Start the killed servers again; wait until every server serves, every bookie and broker is registered (no
    session expired without a leader to expire it), and exactly one broker serves the topic."""
    cluster, rec = state.cluster, state.recorder
    t = time.monotonic()
    for z in state.zk_victims:
        cluster.start_zookeeper_server(z)
    cluster.wait_zookeeper(HEAL_TIMEOUT_S)
    leader = _leader(state)
    rec.event("heal", f"{', '.join(z.name for z in state.zk_victims)} serving again; {leader.name} leads",
              seconds=round(time.monotonic() - t, 3))
    for node in cluster.bookies + cluster.brokers:
        if node.alive() and not node.paused:
            waited = cluster.wait_registered(node)
            rec.event("recovered", f"{node.name} registered", seconds=round(waited, 3))
    owned, detail = check.single_owner(cluster.live_broker_addresses(), TOPIC, SINGLE_OWNER_TIMEOUT_S,
                                       cluster.credentials)
    if owned:
        rec.event("check", f"one broker serves the topic: {detail}")
    else:
        state.failed_checks.append(f"the topic's owner after the ZooKeeper outage: {detail}")


def zk_cut(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        for proxy in state.cluster.proxies[v.name]:
            proxy.block()
        state.recorder.event("fault", f"cut {v.name} off from ZooKeeper (proxies "
                                      f"{', '.join(p.address for p in state.cluster.proxies[v.name])})")


def zk_heal(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        for proxy in state.cluster.proxies[v.name]:
            proxy.unblock()
        state.recorder.event("heal", f"reconnect {v.name} to ZooKeeper")
    for v in victims:
        waited = state.cluster.wait_registered(v)
        state.recorder.event("recovered", f"{v.name} registered again", seconds=round(waited, 3))


# ------------------------------------------------------------------------------------------------ links
def _links_of(state: RunState, step: Step, victims: list[Node]) -> list[tuple[str, TcpProxy]]:
    links = state.cluster.links
    if step.target == StepTarget.OWNER_BOOKIE_LINK:
        broker, bookie = victims
        return [(f"{broker.name}<->{bookie.name}", links[(broker.name, bookie.name)])]
    (bookie,) = victims
    return [(f"{b}<->{k}", p) for (b, k), p in sorted(links.items()) if k == bookie.name]


_HOLDS = {"up": (True, False), "down": (False, True), "both": (True, True)}  # step.arg -> (hold up, hold down)
_HOLD_NAMES = {"both": "blackhole", "up": "one-way loss of the requests (broker->bookie)",
               "down": "one-way loss of the replies (bookie->broker)"}


def link_hold(state: RunState, step: Step, victims: list[Node]) -> None:
    up, down = _HOLDS[step.arg]
    state.held_links = _links_of(state, step, victims)
    for _, proxy in state.held_links:
        proxy.hold(up=up, down=down)
    state.recorder.event("fault", f"{_HOLD_NAMES[step.arg]} on {', '.join(n for n, _ in state.held_links)}")


def link_delay(state: RunState, step: Step, victims: list[Node]) -> None:
    state.held_links = _links_of(state, step, victims)
    for _, proxy in state.held_links:
        proxy.delay(float(step.arg))
    state.recorder.event("fault", f"delay {step.arg} ms on {', '.join(n for n, _ in state.held_links)}")


def link_heal(state: RunState, step: Step, victims: list[Node]) -> None:
    for _, proxy in state.held_links:
        proxy.heal()
    state.recorder.event("heal", f"links healed: {', '.join(n for n, _ in state.held_links)}")
    state.held_links = []


# ------------------------------------------------------------------------------------------------ disks
def stop_flip(state: RunState, step: Step, victims: list[Node]) -> None:
    rec = state.recorder
    for v in victims:
        pid = v.pid
        if not processes.stop(pid, STOP_TIMEOUT_S):
            raise ChaosError(f"{v.name} (pid {pid}) did not stop within {STOP_TIMEOUT_S:.0f} s")
        v.pid = None
        rec.event("fault", f"stop {v.name} (SIGTERM, pid {pid}): its write cache goes to its entry logs")
        first_asked = _first_replica_picker(state, v.node_id)
        what, flip = disk.flip_entry_log_byte(os.path.join(v.home, "ledgers"), state.rng, first_asked)
        rec.event("fault", f"{v.name}: {what}")
        if flip is None:
            state.failed_checks.append(f"{v.name}: {what}")
        else:
            state.flips.append((v, flip))


def _first_replica_picker(state: RunState, bookie_id: str):
    """(ledger, entry) -> True for the writers' acknowledged entries whose read asks `bookie_id` first."""
    acked = {r.ledger_id: set(r.acked) for w in state.writers for r in w.ledgers}
    infos = asyncio.run(check.ledger_infos(list(acked), state.cluster.live_broker_addresses(),
                                           state.cluster.credentials))

    def pick(ledger_id: int, entry_id: int) -> bool:
        info = infos.get(ledger_id)
        if info is None or entry_id not in acked.get(ledger_id, ()):
            return False
        ensemble = next(s.ensemble for s in reversed(info.segments) if s.first_entry_id <= entry_id)
        return ensemble[write_set_indexes(entry_id, len(ensemble), info.write_quorum_size)[0]] == bookie_id
    return pick


def disk_fill(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        what = disk.fill_disk(state.cluster.ledger_dir_seen_by(v), DISK_FULL_FRACTION)
        state.recorder.event("fault", f"{v.name} ledger disk: {what}")
        _wait_read_only(state, v, True)


def disk_drain(state: RunState, step: Step, victims: list[Node]) -> None:
    for v in victims:
        state.recorder.event("heal", f"{v.name} ledger disk: {disk.drain_disk(state.cluster.ledger_dir_seen_by(v))}")
        _wait_read_only(state, v, False)


def _wait_read_only(state: RunState, v: Node, read_only: bool) -> None:
    wanted = "read-only" if read_only else "writable"
    waited = state.cluster.wait_registration(v, lambda doc: doc is not None and doc["read_only"] == read_only,
                                             READ_ONLY_TIMEOUT_S)
    if waited is None:
        state.failed_checks.append(f"{v.name} not registered {wanted} within {READ_ONLY_TIMEOUT_S:.0f} s")
    else:
        state.recorder.event("fault" if read_only else "recovered", f"{v.name} registered {wanted}",
                             seconds=round(waited, 3))


# ------------------------------------------------------------------------------------------------ garbage collection
_GC_LINE = re.compile(r"garbage collection \((\w+)\): (\d+) ledger\(s\) deleted, (\d+) entry log\(s\) deleted, "
                      r"(\d+) compacted")


def ledgers_away_from_faults(writers: list[LedgerWriter], faults: list[dict], now: float,
                             margin_s: float = FAULT_MARGIN_S) -> list:
    """The writers' (undeleted) ledgers closed by their writer whose life, from create to close + `margin_s`,
    overlaps no fault from its start to its heal (`now` for one not healed): every copy of them was written
    while every bookie of their write sets was up, so each of those bookies must hold each entry."""
    spans = [(f["t"], f.get("healed_t", now)) for f in faults]
    return [r for w in writers for r in w.ledgers if r.end == "closed" and r.closed_t is not None
            and all(r.closed_t + margin_s < t or r.created_t > healed for t, healed in spans)]


def verify_gc(state: RunState, step: Step, victims: list[Node]) -> None:
    """After the kills during compaction (gc-under-faults): (1) each killed bookie's start-up finished or deleted
    the compaction file it was killed with, and the file is gone; (2) every entry of each writer ledger that was
    created and closed away from every fault (FAULT_MARGIN_S) is on every bookie of its write set with identical
    bytes, read from each bookie directly (a broker's read fails over, so it would hide a copy that garbage
    collection or compaction lost); (3) garbage collection deleted ledgers (else the run tested nothing).
    It starts VERIFY_AFTER_HEAL_S after the last heal (a restart's wait may have used the schedule's room)."""
    rec = state.recorder
    last_heal = max((f.get("healed_t", 0.0) for f in state.faults), default=0.0)
    delay = last_heal + VERIFY_AFTER_HEAL_S - rec.now()
    if delay > 0:
        time.sleep(delay)  # the schedule: writers create and close ledgers away from the faults meanwhile
    for v, name, mark in state.compaction_kills:
        with open(v.log_path, "rb") as f:
            f.seek(mark)
            said = f.read().decode(errors="replace")
        new_id, old_id, kind = entry_log_fmt.parse_compaction_file_name(name)
        expected = (f"deleted the unfinished compaction file {name}" if kind == entry_log_fmt.COMPACTING
                    else f"finished the compaction of entry log {old_id:x} into {new_id:x}")
        if f"start-up: {expected}" not in said or name in _compaction_files(v):
            state.failed_checks.append(f"{v.name} was killed with {name} on disk: its start-up did not say "
                                       f"{expected!r}, or the file is still there")
        else:
            rec.event("check", f"{v.name} start-up: {expected}")
    away = ledgers_away_from_faults(state.writers, state.faults, rec.now())
    with replicas.ReplicaWatch(state.cluster) as watch:
        problems = watch.replica_problems([r.ledger_id for r in away])
    deleted = {r.ledger_id for w in state.writers for r in w.deleted}  # since the check started: not a loss
    problems = [p for p in problems if int(p.split()[1]) not in deleted]
    state.failed_checks.extend(f"verify-gc: {p}" for p in problems)
    checked = [r.ledger_id for r in away if r.ledger_id not in deleted]
    if not checked:
        state.problems.append("verify-gc: no writer ledger lived away from the faults: no copies verified")
    elif not problems:
        rec.event("check", f"{len(checked)} ledgers created and closed away from the faults: every entry on its "
                           f"write-set bookies with identical bytes")
    totals = {}
    for v in victims:
        with open(v.log_path, errors="replace") as f:
            rounds = _GC_LINE.findall(f.read())
        totals[v.name] = [sum(int(r[i]) for r in rounds) for i in (1, 2, 3)]
    rec.event("check", "garbage collection so far (ledgers deleted, entry logs deleted, compacted): " + ", ".join(
        f"{name} {a}/{b}/{c}" for name, (a, b, c) in totals.items()))
    if not any(a for a, _, _ in totals.values()):
        state.failed_checks.append("verify-gc: no bookie's garbage collection deleted a ledger")


ACTIONS: dict[StepAction, Action] = {
    StepAction.KILL9: kill9,
    StepAction.KILL9_TEAR: kill9_tear,
    StepAction.KILL9_TRUNCATE: kill9_truncate,
    StepAction.KILL9_WIPE: kill9_wipe,
    StepAction.RESTART: restart,
    StepAction.REFORMAT_RESTART: reformat_restart,
    StepAction.PAUSE: pause,
    StepAction.RESUME: resume,
    StepAction.ZK_STOP_START: zk_stop_start,
    StepAction.ZK_KILL9: zk_kill9,
    StepAction.ZK_START: zk_start,
    StepAction.ZK_CUT: zk_cut,
    StepAction.ZK_HEAL: zk_heal,
    StepAction.LINK_HOLD: link_hold,
    StepAction.LINK_DELAY: link_delay,
    StepAction.LINK_HEAL: link_heal,
    StepAction.STOP_FLIP: stop_flip,
    StepAction.DISK_FILL: disk_fill,
    StepAction.DISK_DRAIN: disk_drain,
    StepAction.KILL9_LOST: kill9_lost,
    StepAction.AWAIT_REREPLICATION: await_rereplication,
    StepAction.CHECK_ALL_REPAIR: check_all_repair,
    StepAction.VERIFY_GC: verify_gc,
}
assert set(ACTIONS) == set(StepAction), set(StepAction) - set(ACTIONS)
assert set(TARGETS) == set(StepTarget), set(StepTarget) - set(TARGETS)


# ------------------------------------------------------------------------------------------------ healing
def heal_all(state: RunState) -> list[str]:
    """Whatever a step left broken (it should be none): resume, reconnect, restart (not a bookie lost for good);
    returns what was done."""
    done = []
    cluster = state.cluster
    stopped = [z for z in cluster.zookeepers if z.pid is None or not z.is_running()]
    for z in stopped:
        cluster.start_zookeeper_server(z)
        done.append(f"started {z.name}")
    if stopped:
        cluster.wait_zookeeper(HEAL_TIMEOUT_S)
    for name, proxies in cluster.proxies.items():
        if any(proxy.blocked for proxy in proxies):
            for proxy in proxies:
                proxy.unblock()
            done.append(f"reconnected {name} to ZooKeeper")
    for (broker, bookie), proxy in cluster.links.items():
        if proxy.state() != "ok":
            done.append(f"healed the link {broker}<->{bookie} ({proxy.state()})")
            proxy.heal()
    kept = [n for n in cluster.bookies + cluster.brokers if n.node_id not in state.lost]
    for node in kept:
        if node.paused:
            cluster.resume(node)
            done.append(f"resumed {node.name}")
        if not node.alive():
            cluster.spawn(node)
            done.append(f"restarted {node.name}")
    for node in kept:
        cluster.wait_registered(node, HEAL_TIMEOUT_S)
    for what in done:
        state.recorder.event("heal", f"final heal: {what}")
    return done
