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
- broker-zk-partition: cut the topic owner's connection to ZooKeeper for 4-6 s while it runs (its session
  expires), then reconnect it.
- journal-torn-tail: kill -9 a bookie and append to its newest journal a prefix of a copy of its last record
  (the next group's write, torn by the crash: never acknowledged, so nothing acknowledged is removed), restart
  it (replay must truncate the torn tail and say so); twice. A truncation *into* synced records would remove
  acknowledged replicas: that is injected data loss, which the audit reports, so it is not done here.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the workload started (not before)
    action: str  # kill9 | kill9-tear | restart | pause | resume | zk-stop-start | zk-cut | zk-heal
    target: str  # random-bookie | two-bookies | topic-owner | same | zookeeper
    fault: bool  # True: injects a fault; False: heals one
    down_s: float = 0.0  # zk-stop-start: how long ZooKeeper stays down

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    plan: object  # (random.Random, duration_s) -> list[Step]


def _bookie_kill(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.25)
    t2 = t1 + rng.uniform(2.0, 3.0)
    t3 = max(t2 + 1.0, d * rng.uniform(0.45, 0.55))
    t4 = t3 + rng.uniform(2.0, 3.0)
    return [Step(t1, "kill9", "random-bookie", True), Step(t2, "restart", "same", False),
            Step(t3, "kill9", "two-bookies", True), Step(t4, "restart", "same", False)]


def _bookie_pause(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.25)
    t2 = t1 + rng.uniform(4.0, 6.0)
    t3 = max(t2 + 1.0, d * rng.uniform(0.5, 0.6))
    t4 = t3 + rng.uniform(4.0, 6.0)
    return [Step(t1, "pause", "random-bookie", True), Step(t2, "resume", "same", False),
            Step(t3, "pause", "random-bookie", True), Step(t4, "resume", "same", False)]


def _broker_kill(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.25)
    t2 = t1 + rng.uniform(3.0, 5.0)
    t3 = max(t2 + 1.0, d * rng.uniform(0.5, 0.6))
    t4 = t3 + rng.uniform(3.0, 5.0)
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


def _broker_zk_partition(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.3)
    t2 = t1 + rng.uniform(4.0, 6.0)
    return [Step(t1, "zk-cut", "topic-owner", True), Step(t2, "zk-heal", "same", False)]


def _journal_torn_tail(rng: random.Random, d: float) -> list[Step]:
    t1 = d * rng.uniform(0.15, 0.25)
    t2 = t1 + rng.uniform(1.0, 2.0)
    t3 = max(t2 + 1.0, d * rng.uniform(0.5, 0.6))
    t4 = t3 + rng.uniform(1.0, 2.0)
    return [Step(t1, "kill9-tear", "random-bookie", True), Step(t2, "restart", "same", False),
            Step(t3, "kill9-tear", "random-bookie", True), Step(t4, "restart", "same", False)]


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
    Scenario("broker-zk-partition", "cut the topic owner off from ZooKeeper for 4-6 s (TCP proxy) while it runs: "
             "its session expires, the other broker takes over", _broker_zk_partition),
    Scenario("journal-torn-tail", "kill -9 a bookie, tear its journal's tail (a partial copy of the last record "
             "appended, as a group write cut short), restart: replay must truncate it and serve everything; twice",
             _journal_torn_tail),
)}


def plan(name: str, seed: int, duration_s: float) -> list[Step]:
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    rng = random.Random(f"{name}/{seed}")
    return [Step(round(s.at, 2), s.action, s.target, s.fault, s.down_s) for s in SCENARIOS[name].plan(rng, duration_s)]
