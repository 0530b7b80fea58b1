"""The plans of the simulations: every knob, all drawn from the seed.

BookiePlan (the bookie world) owns the choice of sizes (tiny, so journals and entry logs roll and checkpoints
happen often), the workload mix and the fault plan (crash probability, torn tails, latencies, bit flips).
LedgerPlan (the ledger world) owns the number of bookies and brokers, the writers' and readers' workload, the
network's delays, the timeouts, the bookies' storage knobs and the fault schedule (FaultEvents in virtual
time). `describe()` lists every knob, so a
run can print what it did and a failure can be understood from its output alone.

Invariant: `BookiePlan.from_seed(seed, steps)` and `LedgerPlan.from_seed(seed)` are pure functions of their
arguments.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from bksim.model.config import KiB, MiB, BookieConfig
from bksim.sim.disk import DiskFaults
from bksim.sim.kv import KvFaults

STEPS_DEFAULT = 200  # workload steps per seed: enough for several checkpoints, rolls and crashes
START_CRASHES_MAX = 3  # consecutive crashes during start-up (journal replay) before one is let finish
START_CRASH_DELAY_MS_MAX = 5.0  # a crash during start-up lands within this long after it began
START_TIMEOUT_MS = 60_000.0  # virtual: a bookie start-up (replay) not done by then is a liveness failure
LARGE_DISK_BYTES = 1 << 30
SMALL_DISK_BYTES = 96 * KiB  # fills up within a run: the bookie goes read-only
# workload mix: relative weights of the operations a step may submit
OP_WEIGHTS = (("add", 40), ("recovery_add", 6), ("fence", 3), ("write_lac", 5), ("read", 18),
              ("read_lac", 8), ("checkpoint", 3))


def rng_for(seed: int, part: str) -> random.Random:
    """An independent random stream per part of the world, so a change in one part (say, the workload)
    does not shift the faults drawn by another."""
    return random.Random(f"bksim-sim:{seed}:{part}")


@dataclass(frozen=True, slots=True)
class BookiePlan:
    seed: int
    steps: int
    # workload
    ledgers: int
    batch_entries_max: int
    payload_bytes_max: int
    step_gap_ms_max: float  # virtual time between two submissions, drawn in [0, max]
    inflight_ops_max: int  # client operations waiting for an answer at once
    # faults
    crash_probability: float  # per step
    start_crash_probability: float  # a restart is crashed again during its start-up (replay)
    bit_flip_probability: float  # per step: one bit of a checkpointed entry's entry-log record
    disk: DiskFaults
    kv: KvFaults
    # engine sizes (BookieConfig overrides)
    write_cache_bytes_max: int
    write_cache_throttle_ms_max: int
    journal_file_bytes_max: int
    entry_log_bytes_max: int
    flush_interval_ms: int
    group_wait_ms_max: float
    journal_flush_when_idle: bool
    journal_sync_on_loop: bool
    journal_backups_max: int
    journal_archive: bool
    journal_queue_records_max: int
    recovery_add_reserve_bytes: int

    @classmethod
    def from_seed(cls, seed: int, steps: int = STEPS_DEFAULT) -> "BookiePlan":
        r = rng_for(seed, "plan")
        latency = r.choice([(0.0, 0.0), (0.0, 0.5), (0.1, 3.0)])
        kv_latency = r.choice([(0.0, 0.0), (0.0, 1.0)])
        return cls(
            seed=seed, steps=steps,
            ledgers=r.randint(1, 4),
            batch_entries_max=r.choice([1, 3, 8]),
            payload_bytes_max=r.choice([16, 200, 1500]),
            step_gap_ms_max=r.choice([0.2, 2.0, 10.0]),
            inflight_ops_max=r.choice([1, 4, 16]),
            crash_probability=r.choice([0.0, 0.01, 0.03, 0.06]),
            start_crash_probability=r.choice([0.0, 0.3]),
            bit_flip_probability=r.choice([0.0, 0.0, 0.02]),
            disk=DiskFaults(latency_ms_min=latency[0], latency_ms_max=latency[1],
                            torn_tail_probability=r.choice([0.0, 0.5, 1.0]), torn_zeros_probability=0.3,
                            capacity_bytes=SMALL_DISK_BYTES if r.random() < 0.1 else LARGE_DISK_BYTES),
            kv=KvFaults(latency_ms_min=kv_latency[0], latency_ms_max=kv_latency[1], unsynced_keep_probability=0.5),
            write_cache_bytes_max=r.choice([8 * KiB, 32 * KiB, 256 * KiB]),
            write_cache_throttle_ms_max=r.choice([20, 200]),
            journal_file_bytes_max=r.choice([2 * KiB, 8 * KiB, MiB]),
            entry_log_bytes_max=r.choice([2 * KiB, 16 * KiB, MiB]),
            flush_interval_ms=r.choice([5, 30, 200]),
            group_wait_ms_max=r.choice([0.0, 0.5, 2.0]),
            journal_flush_when_idle=r.random() < 0.3,
            journal_sync_on_loop=r.random() < 0.5,
            journal_backups_max=r.choice([0, 1, 3]),
            journal_archive=r.random() < 0.25,
            journal_queue_records_max=r.choice([8, 10_000]),
            recovery_add_reserve_bytes=4 * KiB,
        )

    def bookie_config(self, journal_archive_dir: str) -> BookieConfig:
        return dataclasses.replace(
            # the worlds' caches of a few KiB are sized in entry bytes: no per-entry overhead counted
            BookieConfig(), write_cache_bytes_max=self.write_cache_bytes_max, write_cache_entry_overhead_bytes=0,
            write_cache_throttle_ms_max=self.write_cache_throttle_ms_max,
            read_cache_bytes_max=self.write_cache_bytes_max,
            journal_file_bytes_max=self.journal_file_bytes_max, entry_log_bytes_max=self.entry_log_bytes_max,
            flush_interval_ms=self.flush_interval_ms, group_wait_ms_max=self.group_wait_ms_max,
            journal_flush_when_idle=self.journal_flush_when_idle, journal_sync_on_loop=self.journal_sync_on_loop,
            journal_backups_max=self.journal_backups_max,
            journal_archive_dir=journal_archive_dir if self.journal_archive else "",
            journal_queue_records_max=self.journal_queue_records_max,
            recovery_add_reserve_bytes=self.recovery_add_reserve_bytes)

    def describe(self) -> list[str]:
        """Every knob as `name = value`, in declaration order (the disk and kv faults flattened)."""
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                for sub in dataclasses.fields(value):
                    lines.append(f"{f.name}.{sub.name} = {getattr(value, sub.name)}")
            else:
                lines.append(f"{f.name} = {value}")
        return lines


# -- the ledger world (sim.ledger_scenario) ---------------------------------------------------------------------
LEDGER_EVENT_WEIGHTS = (("partition", 14), ("slow_bookie", 8), ("lossy_network", 8), ("crash_bookie", 14),
                        ("expire_bookie_session", 5), ("crash_broker", 8), ("recover", 12),
                        ("double_recovery", 6), ("expire_broker_session", 5))


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One fault of the plan: what, when (virtual ms into the run) and for how long. Node names are fixed by
    the plan; a ledger a fault needs (`recover`, `double_recovery`) is chosen when it fires, from the ledgers
    that exist then (with the faults rng), and named in the trace."""
    at_ms: float
    kind: str
    duration_ms: float = 0.0  # partition, slow, lossy: until healed; crash: until restart
    nodes: tuple[str, ...] = ()  # the nodes involved (bookie and/or broker ids)
    one_way: bool = False  # partition: only nodes[0] -> nodes[1] is cut
    amount: float = 0.0  # slow: extra ms; lossy: loss probability
    duplicate: float = 0.0  # lossy: duplication probability
    reorder: bool = False  # lossy: streams reorder
    then_ms: float = 0.0  # crash_broker: another broker takes its ledgers over this long after the crash;
    # double_recovery: the second broker crashes this long after both recoveries started (0: it does not)

    def describe(self) -> str:
        n, k = self.nodes, self.kind
        what = {
            "partition": lambda: f"{n[0]} {'->' if self.one_way else '<->'} {n[1]} "
                                 f"({'one-way' if self.one_way else 'both ways'}) for {self.duration_ms:.2f} ms",
            "slow_bookie": lambda: f"{n[0]} +{self.amount:g} ms per message for {self.duration_ms:.2f} ms",
            "lossy_network": lambda: f"every link: loss {self.amount:g}, duplication {self.duplicate:g}"
                                     f"{', reordering' if self.reorder else ''} for {self.duration_ms:.2f} ms",
            "crash_bookie": lambda: f"{n[0]}, restart after {self.duration_ms:.2f} ms",
            "expire_bookie_session": lambda: n[0],
            "crash_broker": lambda: f"{n[0]}, {n[1]} takes its open ledgers over (recovery) after "
                                    f"{self.then_ms:.2f} ms, restart after {self.duration_ms:.2f} ms",
            "recover": lambda: f"by {n[0]}: an open ledger another broker writes",
            "double_recovery": lambda: f"by {n[0]} and {n[1]} at once: one open ledger"
                                       + (f"; a bookie of its ensemble crashes first, restart after "
                                          f"{self.duration_ms:.2f} ms" if self.duration_ms else "")
                                       + (f"; {n[1]} crashes {self.then_ms:.2f} ms later (its recovery dies "
                                          f"mid-way)" if self.then_ms else ""),
            "expire_broker_session": lambda: f"{n[0]} (it restarts half a session timeout later)",
            "crash_autorecovery": lambda: f"{n[0]} at its next RECOVERY_ADD (mid-copy), restart after "
                                          f"{self.duration_ms:.2f} ms",
            "expire_auditor_session": lambda: "the node whose vote leads (a new auditor is elected)",
            "lose_lock": lambda: "the next worker to copy loses its lock (mid-copy)",
        }[k]()
        return f"at {self.at_ms:8.2f} ms {k} {what}"


def bookie_name(i: int) -> str:
    return f"bookie-{i}"


def broker_name(i: int) -> str:
    return f"broker-{i}"


@dataclass(frozen=True, slots=True)
class LedgerPlan:
    """Every knob of one ledger simulation, drawn from the seed (`from_seed` is a pure function)."""
    seed: int
    # the world
    bookies: int
    brokers: int
    # workload
    ledgers_initial: int
    ledgers_max: int  # a writer whose ledger closes or is fenced rolls to a new one, up to this many in all
    entries_per_ledger_max: int  # a writer closes its ledger after 1..this many appends (the last one: never)
    payload_bytes_max: int
    writer_inflight_max: int  # unacknowledged appends per writer
    appends_per_writer: int  # about this many appends per writer over the safety phase (sets the pace)
    read_probability: float  # per append: a reader on another broker reads the ledger up to its LAC
    run_ms: float  # virtual duration of the safety phase (faults and writes)
    # network and timeouts (virtual ms)
    net_delay_ms: float
    net_jitter_ms: float
    bookie_timeout_ms: float
    speculative_read_ms: float
    session_timeout_ms: float
    # bookie storage
    disk: DiskFaults
    slow_disk_bookie: int  # 0: none; else this bookie's disk has 10x the latency
    start_crash_probability: float
    write_cache_bytes_max: int
    journal_file_bytes_max: int
    entry_log_bytes_max: int
    flush_interval_ms: int
    group_wait_ms_max: float
    # faults
    events: tuple[FaultEvent, ...]
    # the broker's add batching (drawn from a stream of its own, so the knobs above keep their values per seed)
    add_requests_per_bookie_max: int  # broker.add_requests_per_bookie_max (0: each loop turn's adds at once)

    @classmethod
    def from_seed(cls, seed: int) -> "LedgerPlan":
        r = rng_for(seed, "ledger-plan")
        bookies = r.randint(4, 6)
        brokers = r.randint(2, 3)
        run_ms = r.choice([300.0, 600.0, 1000.0])
        latency = r.choice([(0.0, 0.1), (0.05, 0.5), (0.2, 2.0)])
        timeout_ms = r.choice([20, 50, 100])
        events = []
        for _ in range(r.choice([0, 2, 4, 8, 12])):
            events.append(cls._event(r, r.uniform(0.0, run_ms * 0.9), bookies, brokers, run_ms, seed))
        events.sort(key=lambda e: e.at_ms)
        return cls(
            seed=seed, bookies=bookies, brokers=brokers,
            ledgers_initial=r.randint(1, 3), ledgers_max=r.randint(3, 6),
            entries_per_ledger_max=r.choice([10, 30, 80]),
            payload_bytes_max=r.choice([1, 16, 100]),
            writer_inflight_max=r.choice([1, 4, 16]),
            appends_per_writer=r.choice([15, 40, 90]),
            read_probability=r.choice([0.0, 0.03, 0.1]),
            run_ms=run_ms,
            net_delay_ms=r.choice([0.1, 0.5, 1.0]),
            net_jitter_ms=r.choice([0.0, 0.5, 3.0]),
            bookie_timeout_ms=timeout_ms,
            speculative_read_ms=r.choice([timeout_ms // 4, timeout_ms // 2]),
            session_timeout_ms=r.choice([30.0, 100.0, 300.0]),
            disk=DiskFaults(latency_ms_min=latency[0], latency_ms_max=latency[1],
                            torn_tail_probability=r.choice([0.0, 0.5, 1.0]), torn_zeros_probability=0.3),
            slow_disk_bookie=r.choice([0] * 3 + list(range(1, bookies + 1))),
            start_crash_probability=r.choice([0.0, 0.3]),
            write_cache_bytes_max=r.choice([16 * KiB, 64 * KiB, MiB]),
            journal_file_bytes_max=r.choice([4 * KiB, 64 * KiB, MiB]),
            entry_log_bytes_max=r.choice([8 * KiB, MiB]),
            flush_interval_ms=r.choice([20, 60, 200]),
            group_wait_ms_max=r.choice([0.0, 0.2, 1.0]),
            events=tuple(events),
            add_requests_per_bookie_max=rng_for(seed, "ledger-plan-add-batching").choice([0, 1, 2]),
        )

    @staticmethod
    def _event(r: random.Random, at_ms: float, bookies: int, brokers: int, run_ms: float, seed: int) -> FaultEvent:
        total = sum(w for _, w in LEDGER_EVENT_WEIGHTS)
        pick = r.uniform(0.0, total)
        for kind, weight in LEDGER_EVENT_WEIGHTS:
            pick -= weight
            if pick <= 0:
                break
        bookie = bookie_name(r.randint(1, bookies))
        broker = broker_name(r.randint(1, brokers))
        other = broker_name(r.choice([i for i in range(1, brokers + 1) if broker_name(i) != broker]))
        duration = r.uniform(run_ms * 0.02, run_ms * 0.4)
        if kind == "partition":
            pair = (broker, bookie) if r.random() < 0.5 else (bookie, broker)
            return FaultEvent(at_ms, kind, duration, pair, one_way=r.random() < 0.5)
        if kind == "slow_bookie":
            return FaultEvent(at_ms, kind, duration, (bookie,), amount=r.choice([2.0, 10.0, 40.0]))
        if kind == "lossy_network":
            return FaultEvent(at_ms, kind, duration, amount=r.choice([0.0, 0.02, 0.1]),
                              duplicate=r.choice([0.0, 0.05, 0.2]), reorder=r.random() < 0.5)
        if kind == "crash_bookie":
            return FaultEvent(at_ms, kind, duration, (bookie,))
        if kind == "expire_bookie_session":
            return FaultEvent(at_ms, kind, 0.0, (bookie,))
        if kind == "crash_broker":
            return FaultEvent(at_ms, kind, duration, (broker, other), then_ms=r.uniform(0.0, duration))
        if kind in ("recover", "expire_broker_session"):
            return FaultEvent(at_ms, kind, 0.0, (broker,))
        if kind == "double_recovery":
            # the takeover race: a bookie of the ledger's ensemble is down (both write-backs change the ensemble
            # at the same entry), and one of the recovering brokers may die before it finishes; drawn from a
            # stream of its own, so adding these knobs left every other seed's plan as it was
            race = rng_for(seed, f"ledger-plan-takeover-race-{at_ms!r}")
            outage = duration if race.random() < 0.7 else 0.0
            dies_after = race.uniform(0.0, duration) if race.random() < 0.5 else 0.0
            return FaultEvent(at_ms, kind, outage, (broker, other), then_ms=dies_after)
        raise AssertionError(kind)

    @property
    def append_gap_ms_max(self) -> float:
        """Gaps between a writer's appends are uniform in [0, this]: `appends_per_writer` over `run_ms`."""
        return 2.0 * self.run_ms / self.appends_per_writer

    def bookie_config(self) -> BookieConfig:
        return dataclasses.replace(
            # the worlds' caches of a few KiB are sized in entry bytes: no per-entry overhead counted
            BookieConfig(), write_cache_bytes_max=self.write_cache_bytes_max, write_cache_entry_overhead_bytes=0,
            read_cache_bytes_max=self.write_cache_bytes_max, journal_file_bytes_max=self.journal_file_bytes_max,
            entry_log_bytes_max=self.entry_log_bytes_max, flush_interval_ms=self.flush_interval_ms,
            group_wait_ms_max=self.group_wait_ms_max,
            # every bookie shares the one SimLoop: a sync on the loop would stall every process, not just its own
            journal_sync_on_loop=False)

    def disk_for(self, bookie: int) -> DiskFaults:
        """The slow-disk bookie's calls take 10x longer, capped at an eighth of the bookie timeout (slow, not
        dead: a disk slower than the timeout is a crash that never ends, which the liveness phase cannot heal)."""
        if bookie != self.slow_disk_bookie:
            return self.disk
        cap = self.bookie_timeout_ms / 8
        return dataclasses.replace(self.disk, latency_ms_min=min(cap, self.disk.latency_ms_min * 10),
                                   latency_ms_max=min(cap, max(1.0, self.disk.latency_ms_max * 10)))

    def describe(self) -> list[str]:
        """Every knob as `name = value` (disk faults flattened), then the fault plan, one event a line."""
        lines = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "events":
                lines.append(f"events = {len(value)}")
                lines += [f"  {event.describe()}" for event in value]
            elif dataclasses.is_dataclass(value):
                lines += [f"{f.name}.{sub.name} = {getattr(value, sub.name)}" for sub in dataclasses.fields(value)]
            else:
                lines.append(f"{f.name} = {value}")
        return lines


# -- the autorecovery world (sim.autorecovery_scenario) -----------------------------------------------------------
AUTORECOVERY_EVENT_WEIGHTS = (("crash_autorecovery", 10), ("expire_auditor_session", 8), ("lose_lock", 6))


def autorecovery_name(i: int) -> str:
    return f"autorecovery-{i}"


@dataclass(frozen=True, slots=True)
class AutorecoveryPlan:
    """The autorecovery knobs over a LedgerPlan, drawn from a stream of their own (`rng_for(seed,
    "autorecovery-plan")`), so the ledger world's plan of the same seed is unchanged: the auditor and worker
    nodes, their intervals, and their faults (FaultEvents of kinds `lose_bookie`, `crash_autorecovery`: a
    node dies at its next RECOVERY_ADD, mid-copy; `expire_auditor_session`: the node whose vote leads loses its
    session; `lose_lock`: the next worker to send a RECOVERY_ADD loses its lock: another may claim the ledger)."""
    nodes: int  # autorecovery processes (each: one Auditor candidate and its workers, one metadata session)
    workers_per_node: int
    bookie_check_interval_ms: int
    lost_bookie_recovery_delay_ms: int
    open_ledger_rereplication_grace_ms: int
    read_batch_entries: int
    lost_bookie: str  # "": no bookie is lost for good
    lose_bookie_at_ms: float
    second_lost_bookie: str  # "": none; else lost for good once every ledger is CLOSED, before autorecovery settles
    events: tuple[FaultEvent, ...]

    @classmethod
    def from_seed(cls, seed: int, ledger: LedgerPlan) -> "AutorecoveryPlan":
        r = rng_for(seed, "autorecovery-plan")
        names = [bookie_name(i) for i in range(1, ledger.bookies + 1)]
        lost = r.choice(names) if r.random() < 0.8 else ""
        # a second loss needs 5 bookies: 3 stay, E = 2 leaves a spare
        second = r.choice([n for n in names if n != lost]) if lost and ledger.bookies >= 5 and r.random() < 0.3 else ""
        nodes = r.randint(1, 3)
        events = []
        for _ in range(r.choice([0, 1, 2, 4])):
            total = sum(w for _, w in AUTORECOVERY_EVENT_WEIGHTS)
            pick = r.uniform(0.0, total)
            for kind, weight in AUTORECOVERY_EVENT_WEIGHTS:
                pick -= weight
                if pick <= 0:
                    break
            node = autorecovery_name(r.randint(1, nodes))
            events.append(FaultEvent(r.uniform(0.0, ledger.run_ms * 0.9), kind,
                                     r.uniform(ledger.run_ms * 0.05, ledger.run_ms * 0.5), (node,)))
        events.sort(key=lambda e: e.at_ms)
        return cls(nodes=nodes, workers_per_node=r.randint(1, 2), bookie_check_interval_ms=r.choice([50, 100]),
                   lost_bookie_recovery_delay_ms=r.choice([0, 0, 200, 1000]),
                   open_ledger_rereplication_grace_ms=r.choice([200, 1000]),
                   read_batch_entries=r.choice([1, 4, 64]),
                   lost_bookie=lost, lose_bookie_at_ms=r.uniform(0.0, ledger.run_ms * 0.9),
                   second_lost_bookie=second, events=tuple(events))

    def describe(self) -> list[str]:
        lines = [f"autorecovery.{f.name} = {getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if f.name != "events"]
        lines.append(f"autorecovery.events = {len(self.events)}")
        return lines + [f"  {event.describe()}" for event in self.events]


# -- the garbage-collection world (sim.gc_scenario) ---------------------------------------------------------------
# the bookie world's mix plus: a writer rolling to a new ledger (created in the metadata first), a ledger deleted
# from the metadata, and garbage-collection rounds of each kind (bookie/gc.py KINDS)
GC_OP_WEIGHTS = OP_WEIGHTS + (("roll", 4), ("delete_ledger", 5), ("gc", 4), ("minor", 3), ("major", 3))
GC_CRASH_POINTS_EXTRA_MAX = 2  # crash points per seed besides the one the seed's number picks


@dataclass(frozen=True, slots=True)
class GcPlan:
    """The garbage-collection knobs over a BookiePlan, drawn from a stream of their own (`rng_for(seed,
    "gc-plan")`): the simulated metadata store's faults (a listing that fails, breaks off midway, or answers
    late with the state it had when asked), the garbage collector's settings, the workload's deletions, and
    the crash points: (fault step, k) = crash the k-th time the engine reaches that step. The first point's
    step is `steps[seed % len(steps)]`, so any run of len(steps) consecutive seeds aims at every step."""
    listing_failure_probability: float  # per listing: fails before answering
    listing_partial_probability: float  # per listing: breaks off after some pages
    listing_page_ledgers: int
    listing_lag_ms_max: float  # a listing answers this long (at most) after it was asked, with the state then
    exists_failure_probability: float  # per verification read
    gc_verify_metadata: bool
    minor_compaction_threshold: float
    major_compaction_threshold: float
    compaction_rate_bytes_per_s: int  # 0: unlimited
    entry_log_bytes_max: int  # small: logs roll often, so there are sealed logs to delete and compact
    delete_open_probability: float  # a deletion takes a ledger its writer is still writing
    crash_points: tuple[tuple[str, int], ...]
    # with verification on only: half the listings answer with the store's state up to this long before they
    # were asked (a ZooKeeper server behind the leader), which the generation rule cannot cover
    listing_stale_ms_max: float

    @classmethod
    def from_seed(cls, seed: int, steps: tuple[str, ...]) -> "GcPlan":
        r = rng_for(seed, "gc-plan")
        minor = r.choice([0.2, 0.5])
        points = [(steps[seed % len(steps)], r.randint(1, 2))]
        for _ in range(r.randint(0, GC_CRASH_POINTS_EXTRA_MAX)):
            points.append((r.choice(steps), r.randint(1, 3)))
        knobs = dict(listing_failure_probability=r.choice([0.0, 0.1, 0.3]),
                     listing_partial_probability=r.choice([0.0, 0.1, 0.3]),
                     listing_page_ledgers=r.choice([1, 4, 16]),
                     listing_lag_ms_max=r.choice([0.0, 5.0, 30.0]),
                     exists_failure_probability=r.choice([0.0, 0.1]),
                     gc_verify_metadata=r.random() < 0.5,
                     minor_compaction_threshold=minor,
                     major_compaction_threshold=r.choice([m for m in (0.5, 0.8, 1.0) if m >= minor]),
                     compaction_rate_bytes_per_s=r.choice([0, 0, 256 * KiB]),
                     entry_log_bytes_max=r.choice([2 * KiB, 8 * KiB, 16 * KiB]),
                     delete_open_probability=r.choice([0.0, 0.2, 0.5]),
                     crash_points=tuple(points))
        stale_ms = r.choice([0.0, 20.0])  # drawn last: the knobs above stay what they were without it
        return cls(**knobs, listing_stale_ms_max=stale_ms if knobs["gc_verify_metadata"] else 0.0)

    def bookie_plan(self, plan: BookiePlan) -> BookiePlan:
        return dataclasses.replace(plan, entry_log_bytes_max=self.entry_log_bytes_max)

    def bookie_config(self, config: BookieConfig) -> BookieConfig:
        return dataclasses.replace(config, gc_verify_metadata=self.gc_verify_metadata,
                                   minor_compaction_threshold=self.minor_compaction_threshold,
                                   major_compaction_threshold=self.major_compaction_threshold,
                                   compaction_rate_bytes_per_s=self.compaction_rate_bytes_per_s)

    def describe(self) -> list[str]:
        return [f"gc.{f.name} = {getattr(self, f.name)}" for f in dataclasses.fields(self)]
