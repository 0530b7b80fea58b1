"""The named chaos scenarios: each draws its fault schedule (a list of Steps) from a seeded random generator.

A Step is "not before `at` seconds after the workload started, do `action` to `target`". Targets are
chosen when the step runs (`target` is a rule: "random-bookie", "two-bookies", "topic-owner", "same" = the
previous step's victims), so a schedule is reproducible from the seed while it still follows what the
cluster does (which broker owns the topic now). Every fault is healed by a later step of the same scenario;
the runner heals anything left over before the checks and says so.

Times are fractions of the run's `duration` plus outage lengths chosen beyond the cluster's timeouts:
ZooKeeper session 2 s, the brokers' bookie timeout 3 s (runner.CHILD_ENV), so a pause of 4-6 s makes a
bookie miss adds and expire, and a broker lose its session and its topics.

Scenarios:
- bookie-kill: kill -9 one bookie, restart it; then kill Qw-Qa+1 = 2 bookies at once (the 3/3/2 ledgers
  cannot reach Qa any more; the 2/2/2 ones cannot change ensemble), restart both.
- bookie-pause: SIGSTOP one bookie for 4-6 s, SIGCONT; then another.
- broker-kill: kill -9 the broker that owns the topic (the other takes it over), restart it; again.
- broker-pause: SIGSTOP the topic's owner for 5-7 s (its session expires, the other broker takes over and
  fences its ledgers); SIGCONT: it must come back fenced and not write.
- zookeeper-restart: stop ZooKeeper (SIGTERM), keep it down 1-3 s, start it on the same data; twice.
- zookeeper-node-kill (3 ZooKeeper servers): kill -9 a follower, start it again 2-4 s later; then another one.
  Clients of the killed server move to the others with their sessions; nothing a client sees beyond a pause.
- zookeeper-leader-kill (3 servers): kill -9 the ensemble's leader (the others elect a new one, timed), start it
  again 2-4 s later (it rejoins as a follower); then the new leader.
- zookeeper-quorum-loss (3 servers): kill -9 two of them for 3-5 s (beyond the 2 s session timeout): the last
  one stops serving, metadata changes fail, appends to open ledgers on a stable ensemble may go on; no session
  can expire without a leader, so when both are back every bookie and broker keeps its registration (waited
  for), and exactly one broker serves the topic (the others answer NOT_OWNER): it was never handed out twice.
- broker-zk-partition: cut the topic owner's connection to ZooKeeper for 4-6 s while it runs (its session
  expires), then reconnect it.
- journal-torn-tail: kill -9 a bookie and append to its newest journal a prefix of a copy of its last record
  (the next group's write, torn by the crash: never acknowledged, so nothing acknowledged is removed), restart
  it (replay must truncate the torn tail and say so); then kill -9 a bookie and truncate its newest journal at
  a random byte inside its last records (a disk that lost synced bytes: that bookie's copies of those entries
  are gone), restart: reads must still return every acknowledged entry (from the other replicas) and the audit
  must report exactly those lost copies and nothing else.
- bookie-link-blackhole: the link between the topic's owner and one bookie delivers nothing (both directions,
  no error, no reset: TCP retransmitting into a black hole) for 4-6 s; then every broker's link to one bookie.
- bookie-link-delay: every broker's link to one bookie delays each byte 3.5-5 s (beyond the 3 s bookie
  timeout: adds time out, ensemble change) for 5-7 s; then the owner's link to one bookie 0.1-0.8 s (below it:
  slower, no ensemble change) for 4-6 s.
- bookie-link-loss: one-way loss on every broker's link to one bookie for 4-6 s: first one direction (the
  requests, or the replies), then the other on another bookie.
- entrylog-flip: stop a bookie (SIGTERM: it flushes its write cache to its entry logs), flip one payload byte of
  a stored entry that bookie is the first replica to be asked for, restart it: the bookie serves the bad copy,
  the digest check fails and the reader must fail over, never report the entry missing.
- disk-full: fill the file system of one bookie's ledger directory (a 64 MiB tmpfs in the bookie's own mount
  namespace) past disk_usage_threshold: it must go read-only (registered under /ledgers/available/readonly,
  adds refused, ensembles change away), then drain it below the low-water mark: writable again.
- bookie-wipe: kill -9 a bookie and wipe its journal and ledger directories: it must refuse to start; an
  operator re-initialises it (`bksim bookie format --delete-cookie`) and it starts as a new bookie with the same
  id; reads fail over to the other replicas and the audit reports the entries that lost their replica there.
- bookie-lost (5 bookies): kill -9 a bookie and never restart it; autorecovery (in every bookie, no lost-bookie
  delay) must replace it in every closed ledger (bounded wait: no mark left on a closed ledger, no closed
  ledger's metadata names it); then a second bookie lost for good after that repair: nothing acknowledged may be
  lost, and the report gives the time from each loss to full replication.
- disk-damage-repair (4 bookies): kill -9 a bookie, wipe its directories, re-initialise it (as bookie-wipe; a
  lost-bookie delay longer than the run, so it is not counted lost), then ask for the check of all ledgers
  (`bksim autorecovery check-all`): the workers must replace its damaged copies; the verdict needs every entry
  of every closed ledger on its Qw bookies with identical bytes.
- gc-under-faults: the bookies collect garbage every 0.5 s and compact at minor 0.5 / major 0.8 every 1-2 s
  (32 KiB entry logs, 16 KiB/s of copying, 200 ms checkpoints); the ledger writers roll a ledger every 100
  entries and delete their closed ledgers beyond the newest 2, so entry logs mix live and deleted ledgers;
  kill -9 a bookie while it compacts (one with a compaction file in its entry-log directory, waited for at most
  5 s, else any bookie), restart it; again; then verify: each killed bookie's start-up dealt with the compaction
  file it was killed with, every entry of each writer ledger that lived and was closed away from any fault is
  on every bookie of its write set with identical bytes (a copy garbage collection or compaction lost would
  show here: reads through a broker fail over and would hide it), and garbage collection deleted ledgers.
"""
from __future__ import annotations

import enum
import random
from dataclasses import asdict, dataclass


class StepAction(enum.StrEnum):
    """What a step does (actions.py has one handler per member)."""
    KILL9 = "kill9"
    KILL9_TEAR = "kill9-tear"
    KILL9_TRUNCATE = "kill9-truncate"
    KILL9_WIPE = "kill9-wipe"
    RESTART = "restart"
    REFORMAT_RESTART = "reformat-restart"
    PAUSE = "pause"
    RESUME = "resume"
    ZK_STOP_START = "zk-stop-start"
    ZK_KILL9 = "zk-kill9"  # kill -9 the ZooKeeper servers the target chose
    ZK_START = "zk-start"  # start them again and wait until they serve (and everyone re-registers)
    ZK_CUT = "zk-cut"
    ZK_HEAL = "zk-heal"
    LINK_HOLD = "link-hold"
    LINK_DELAY = "link-delay"
    LINK_HEAL = "link-heal"
    STOP_FLIP = "stop-flip"
    DISK_FILL = "disk-fill"
    DISK_DRAIN = "disk-drain"
    KILL9_LOST = "kill9-lost"
    AWAIT_REREPLICATION = "await-rereplication"
    CHECK_ALL_REPAIR = "check-all-repair"
    VERIFY_GC = "verify-gc"


class StepTarget(enum.StrEnum):
    """The rule that picks a step's victims when it runs (actions.py has one chooser per member)."""
    RANDOM_BOOKIE = "random-bookie"
    TWO_BOOKIES = "two-bookies"
    TOPIC_OWNER = "topic-owner"
    SAME = "same"  # the previous step's victims
    ZOOKEEPER = "zookeeper"
    ZOOKEEPER_FOLLOWER = "zookeeper-follower"  # a random follower of the ensemble
    ZOOKEEPER_LEADER = "zookeeper-leader"  # the ensemble's leader now (bounded wait for one)
    ZOOKEEPER_MAJORITY = "zookeeper-majority"  # a random majority of the servers (the quorum is lost)
    OWNER_BOOKIE_LINK = "owner-bookie-link"
    BOOKIE_LINKS = "bookie-links"
    SMALL_DISK_BOOKIE = "small-disk-bookie"
    COMPACTING_BOOKIE = "compacting-bookie"  # a bookie with a compaction under way (bounded wait), else any
    ALL_BOOKIES = "all-bookies"


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the workload started (not before)
    action: StepAction  # given as a member or its name ("kill9"); an unknown name raises ValueError
    target: StepTarget  # likewise ("random-bookie")
    fault: bool  # True: injects a fault; False: heals one
    down_s: float = 0.0  # zk-stop-start: how long ZooKeeper stays down
    arg: str = ""  # link-hold: up | down | both; link-delay: milliseconds

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", StepAction(self.action))
        object.__setattr__(self, "target", StepTarget(self.target))

    def to_dict(self) -> dict:
        """Plain data (the action and target as their names), as report.json's "plan" holds it."""
        out = asdict(self)
        out["action"], out["target"] = self.action.value, self.target.value
        return out


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    plan: object  # (random.Random, duration_s) -> list[Step]
    links: bool = False  # the cluster routes every broker->bookie link through a proxy
    bookies: int = 3  # bookies in the cluster (a replacement for a lost one needs more than the widest E)
    zookeepers: int = 1  # ZooKeeper servers (3: an ensemble)
    env: tuple[tuple[str, str], ...] = ()  # BKSIM_ overrides of this scenario's bookies and brokers
    writer_options: tuple[tuple[str, int], ...] = ()  # keyword arguments of its ledger writers (workload.py)


def _two_outages(rng: random.Random, d: float, length: tuple[float, float]) -> tuple[float, float, float, float]:
    t1 = d * rng.uniform(0.15, 0.25)
    t2 = t1 + rng.uniform(*length)
    t3 = max(t2 + 1.0, d * rng.uniform(0.5, 0.6))
    return t1, t2, t3, t3 + rng.uniform(*length)


def _bookie_kill(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.25)
    t2 = t1 + rng.uniform(2.0, 3.0)
    t3 = max(t2 + 1.0, d * rng.uniform(0.45, 0.55))
    t4 = t3 + rng.uniform(2.0, 3.0)
    return [Step(t1, "kill9", "random-bookie", True), Step(t2, "restart", "same", False),
            Step(t3, "kill9", "two-bookies", True), Step(t4, "restart", "same", False)]


def _bookie_pause(rng: random.Random, d: float) -> list[Step]:
    t1, t2, t3, t4 = _two_outages(rng, d, (4.0, 6.0))
    return [Step(t1, "pause", "random-bookie", True), Step(t2, "resume", "same", False),
            Step(t3, "pause", "random-bookie", True), Step(t4, "resume", "same", False)]


def _broker_kill(rng: random.Random, d: float) -> list[Step]:
    t1, t2, t3, t4 = _two_outages(rng, d, (3.0, 5.0))
    return [Step(t1, "kill9", "topic-owner", True), Step(t2, "restart", "same", False),
            Step(t3, "kill9", "topic-owner", True), Step(t4, "restart", "same", False)]


def _broker_pause(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.3)
    t2 = t1 + rng.uniform(5.0, 7.0)
    return [Step(t1, "pause", "topic-owner", True), Step(t2, "resume", "same", False)]


def _zookeeper_restart(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.25)
    t2 = max(t1 + 4.0, d * rng.uniform(0.5, 0.6))
    return [Step(t1, "zk-stop-start", "zookeeper", True, round(rng.uniform(1.0, 3.0), 2)),
            Step(t2, "zk-stop-start", "zookeeper", True, round(rng.uniform(1.0, 3.0), 2))]


def _zookeeper_server_kill(target: str):
    def plan(rng: random.Random, d: float) -> list[Step]:
        t1, t2, t3, t4 = _two_outages(rng, d, (2.0, 4.0))
        return [Step(t1, "zk-kill9", target, True), Step(t2, "zk-start", "same", False),
                Step(t3, "zk-kill9", target, True), Step(t4, "zk-start", "same", False)]
    return plan


def _zookeeper_quorum_loss(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.2, 0.3)
    return [Step(t1, "zk-kill9", "zookeeper-majority", True),
            Step(t1 + rng.uniform(3.0, 5.0), "zk-start", "same", False)]


def _broker_zk_partition(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.3)
    t2 = t1 + rng.uniform(4.0, 6.0)
    return [Step(t1, "zk-cut", "topic-owner", True), Step(t2, "zk-heal", "same", False)]


def _journal_tear_and_truncate(rng: random.Random, d: float) -> list[Step]:
    t1, t2, t3, t4 = _two_outages(rng, d, (1.0, 2.0))
    return [Step(t1, "kill9-tear", "random-bookie", True), Step(t2, "restart", "same", False),
            Step(t3, "kill9-truncate", "random-bookie", True), Step(t4, "restart", "same", False)]


def _link_blackhole(rng: random.Random, d: float) -> list[Step]:
    t1, t2, t3, t4 = _two_outages(rng, d, (4.0, 6.0))
    return [Step(t1, "link-hold", "owner-bookie-link", True, arg="both"), Step(t2, "link-heal", "same", False),
            Step(t3, "link-hold", "bookie-links", True, arg="both"), Step(t4, "link-heal", "same", False)]


def _link_delay(rng: random.Random, d: float) -> list[Step]:
    t1, _, t3, t4 = _two_outages(rng, d, (4.0, 6.0))
    t2 = t1 + rng.uniform(5.0, 7.0)
    t3 = max(t3, t2 + 1.0)
    return [Step(t1, "link-delay", "bookie-links", True, arg=str(rng.randint(3500, 5000))),
            Step(t2, "link-heal", "same", False),
            Step(t3, "link-delay", "owner-bookie-link", True, arg=str(rng.randint(100, 800))),
            Step(max(t4, t3 + 4.0), "link-heal", "same", False)]


def _link_loss(rng: random.Random, d: float) -> list[Step]:
    t1, t2, t3, t4 = _two_outages(rng, d, (4.0, 6.0))
    first = rng.choice(["up", "down"])
    second = "down" if first == "up" else "up"
    return [Step(t1, "link-hold", "bookie-links", True, arg=first), Step(t2, "link-heal", "same", False),
            Step(t3, "link-hold", "bookie-links", True, arg=second), Step(t4, "link-heal", "same", False)]


def _entrylog_flip(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.3, 0.4)
    return [Step(t1, "stop-flip", "random-bookie", True), Step(t1 + rng.uniform(0.5, 1.5), "restart", "same", False)]


def _disk_full(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.25)
    return [Step(t1, "disk-fill", "small-disk-bookie", True),
            Step(t1 + rng.uniform(4.0, 6.0), "disk-drain", "same", False)]


def _bookie_wipe(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.2, 0.3)
    return [Step(t1, "kill9-wipe", "random-bookie", True),
            Step(t1 + rng.uniform(1.0, 2.0), "reformat-restart", "same", False)]


def _bookie_lost(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.25)
    t3 = d * rng.uniform(0.5, 0.6)
    return [Step(t1, "kill9-lost", "random-bookie", True), Step(t1 + 0.5, "await-rereplication", "same", False),
            Step(t3, "kill9-lost", "random-bookie", True), Step(t3 + 0.5, "await-rereplication", "same", False)]


def _disk_damage_repair(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.2, 0.3)
    t2 = t1 + rng.uniform(1.0, 2.0)
    return [Step(t1, "kill9-wipe", "random-bookie", True), Step(t2, "reformat-restart", "same", False),
            Step(max(t2 + 1.0, d * rng.uniform(0.5, 0.6)), "check-all-repair", "same", False)]


def _gc_under_faults(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.2, 0.3)
    t2 = t1 + rng.uniform(1.5, 2.5)
    t3 = max(t2 + 1.0, d * rng.uniform(0.5, 0.6))
    t4 = t3 + rng.uniform(1.5, 2.5)
    return [Step(t1, "kill9", "compacting-bookie", True), Step(t2, "restart", "same", False),
            Step(t3, "kill9", "compacting-bookie", True), Step(t4, "restart", "same", False),
            Step(t4 + 3.0, "verify-gc", "all-bookies", False)]


# scenarios whose audit must count exactly the copies their faults destroyed: nothing may repair them first
_NO_AUTORECOVERY_ENV = (("BKSIM_AUTORECOVERY_ENABLED", "false"),)
# autorecovery's bookie poll and worker back-off short enough for a run of a few seconds
_AUTORECOVERY_ENV = (("BKSIM_AUTORECOVERY_BOOKIE_CHECK_INTERVAL_MS", "200"),
                     ("BKSIM_AUTORECOVERY_WORKER_BACKOFF_MS", "300"))

# garbage collection and compaction every second or two, on entry logs small enough to roll every few seconds
_GC_ENV = (("BKSIM_BOOKIE_ENTRY_LOG_BYTES_MAX", str(32 * 1024)), ("BKSIM_BOOKIE_FLUSH_INTERVAL_MS", "200"),
           ("BKSIM_BOOKIE_GC_WAIT_TIME_MS", "500"), ("BKSIM_BOOKIE_MINOR_COMPACTION_INTERVAL_MS", "1000"),
           ("BKSIM_BOOKIE_MAJOR_COMPACTION_INTERVAL_MS", "2000"), ("BKSIM_BOOKIE_MINOR_COMPACTION_THRESHOLD", "0.5"),
           ("BKSIM_BOOKIE_MAJOR_COMPACTION_THRESHOLD", "0.8"),
           ("BKSIM_BOOKIE_COMPACTION_RATE_BYTES_PER_S", str(16 * 1024)))
# writers that roll a ledger every 100 entries (~0.7 s) and delete their closed ledgers beyond the newest 2
_DELETING_WRITERS = (("entries_per_ledger", 100), ("keep_closed", 2))

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("bookie-kill", "kill -9 a bookie and restart it; then Qw-Qa+1 = 2 bookies at once, restart both",
             _bookie_kill),
    Scenario("bookie-pause", "SIGSTOP a bookie for 4-6 s (beyond the bookie and session timeouts), SIGCONT; twice",
             _bookie_pause),
    Scenario("broker-kill", "kill -9 the broker owning the topic (takeover by the other), restart it; twice",
             _broker_kill),
    Scenario("broker-pause", "SIGSTOP the topic's owner for 5-7 s (session expires, takeover), SIGCONT: it must "
             "come back fenced", _broker_pause),
    Scenario("zookeeper-restart", "stop ZooKeeper, keep it down 1-3 s, start it again on the same data; twice",
             _zookeeper_restart),
    Scenario("zookeeper-node-kill", "kill -9 a follower of the three ZooKeeper servers, start it 2-4 s later; then "
             "another: a pause at most, same sessions", _zookeeper_server_kill("zookeeper-follower"), zookeepers=3),
    Scenario("zookeeper-leader-kill", "kill -9 the ZooKeeper leader (a new one is elected), start it 2-4 s later; "
             "then the new leader", _zookeeper_server_kill("zookeeper-leader"), zookeepers=3),
    Scenario("zookeeper-quorum-loss", "kill -9 two of the three ZooKeeper servers for 3-5 s: no metadata changes, "
             "no session expires, the topic keeps exactly one owner; everything resumes", _zookeeper_quorum_loss,
             zookeepers=3),
    Scenario("broker-zk-partition", "cut the topic owner off from ZooKeeper for 4-6 s (TCP proxy) while it runs: "
             "its session expires, the other broker takes over", _broker_zk_partition),
    Scenario("journal-torn-tail", "kill -9 a bookie, tear its journal's tail (a partial copy of the last record "
             "appended, as a group write cut short), restart: replay truncates it; then kill -9 one and truncate its "
             "journal at a random byte of its last records: reads lose nothing, the audit reports exactly the lost "
             "copies", _journal_tear_and_truncate, env=_NO_AUTORECOVERY_ENV),
    Scenario("bookie-link-blackhole", "the owner's link to one bookie delivers nothing for 4-6 s (TCP into a black "
             "hole: no error, no reset); then every broker's link to one bookie", _link_blackhole, links=True),
    Scenario("bookie-link-delay", "every broker's link to one bookie delayed 3.5-5 s (beyond the bookie timeout) "
             "for 5-7 s; then the owner's link to one bookie 0.1-0.8 s for 4-6 s", _link_delay, links=True),
    Scenario("bookie-link-loss", "one-way loss on every broker's link to one bookie for 4-6 s: requests (or "
             "replies) only; then the other direction on another bookie", _link_loss, links=True),
    Scenario("entrylog-flip", "stop a bookie, flip a payload byte of an entry in its entry log that it is asked "
             "for first, restart: reads fail over on the digest mismatch, never 'no entry'", _entrylog_flip),
    Scenario("disk-full", "fill one bookie's ledger disk (its own 64 MiB tmpfs) past the threshold: read-only; "
             "drain it: writable again", _disk_full),
    Scenario("bookie-wipe", "kill -9 a bookie and wipe its directories: it must refuse to start; re-initialise it "
             "(bksim bookie format): a new bookie; the audit reports the entries that lost a replica", _bookie_wipe,
             env=_NO_AUTORECOVERY_ENV),
    Scenario("bookie-lost", "kill -9 a bookie for good: autorecovery replaces it in every closed ledger (bounded "
             "wait); then a second one for good: nothing acknowledged lost; time from each loss to full "
             "replication", _bookie_lost, bookies=5,
             env=_AUTORECOVERY_ENV + (("BKSIM_AUTORECOVERY_LOST_BOOKIE_RECOVERY_DELAY_MS", "0"),)),
    Scenario("disk-damage-repair", "kill -9 a bookie, wipe and re-initialise it, ask for the check of all ledgers: "
             "its damaged copies are replaced; every entry again on Qw bookies with identical bytes",
             _disk_damage_repair, bookies=4,
             env=_AUTORECOVERY_ENV + (("BKSIM_AUTORECOVERY_LOST_BOOKIE_RECOVERY_DELAY_MS", "600000"),)),
    Scenario("gc-under-faults", "garbage collection and compaction every second while the writers delete their old "
             "ledgers; kill -9 a bookie while it compacts, restart it; twice; every copy of the live ledgers "
             "still on its bookies", _gc_under_faults, env=_GC_ENV, writer_options=_DELETING_WRITERS),
)}


def plan(name: str, seed: int, duration_s: float) -> list[Step]:
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    rng = random.Random(f"{name}/{seed}")
    return [Step(round(s.at, 2), s.action, s.target, s.fault, s.down_s, s.arg)
            for s in SCENARIOS[name].plan(rng, duration_s)]
