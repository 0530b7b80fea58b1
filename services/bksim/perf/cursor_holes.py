"""cursor-holes: a cursor with millions of ack holes survives a broker kill and a clean restart,
with the size of its snapshot and the time to persist and to recover it.

The world: a real ZooKeeper and real bookie processes (perf.ledger_write.LedgerCluster, without a broker
process). The broker side runs in this process, as `bksim broker run` wires it (`InProcessBroker`: a kazoo
session, ZkMetadataStore, GrpcBookieTransport, LedgerService); each "broker" has its own ZooKeeper session and
bookie connections. The topic's message ledgers are not written: the cursor reads only the layout, so
`FixedLayout` plays a managed ledger of `entries` entries in ledgers of `ledger_entries` each. The cursor
ledger and the cursor znode are real.

`roundtrip()` (also run by tests/integration/test_cursor_durability.py):
 1. broker A opens the cursor (earliest) and acks the pattern: "alternate" = every other entry (entry 0 of the
    topic unacked, so mark-delete stays before it and every acked entry is an island: entries/2 holes), or
    "random" = each entry with probability 1/2 (a bitmap that does not compress: chunked snapshots);
 2. A persists (timed: "persist"), then is dropped without closing, as by kill -9 (`abort`);
 3. broker B opens it: recovery-opens A's cursor ledger (fencing it) and reads the last snapshot (timed:
    "recover after kill"); every acked entry and hole must be back, bit for bit;
 4. B closes cleanly (timed: "close": the state is too large for the znode, so a final snapshot goes to a new
    cursor ledger, which is closed and named by the znode);
 5. broker C opens it (timed: "recover after clean close") and checks it again; then the cursor is deleted.
A mismatch raises RuntimeError naming what differs.
"""
from __future__ import annotations

import asyncio
import bisect
import random
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

from bksim.topics.managed_cursor import ManagedCursor
from bksim.topics.positions import Position
from bksim.model.config import Config, TopicConfig
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import LatencyRecorder, Result, make_result

TARGET_ENTRIES = 10_000_000
ACK_BATCH = 100_000  # positions per ack() call
LEDGER_ENTRIES_DEFAULT = 50_000  # = topic.ledger_entries_max's default: a topic of 10M entries has 200 ledgers
PATTERNS = ("alternate", "random")
ML_PATH = "/managed-ledgers/perf/cursor-holes/persistent/topic"
CURSOR_NAME = "holes"
ZK_CONNECT_TIMEOUT_S = 15.0


class FixedLayout:
    """A managed ledger as the cursor sees it (topics.layout.LedgerLayout): ledgers first_ledger,
    first_ledger + 1, ... of `ledger_entries` entries each (the last one shorter), all confirmed."""

    def __init__(self, entries: int, ledger_entries: int, first_ledger: int = 1_000) -> None:
        assert entries >= 1 and ledger_entries >= 1
        self.entries = entries
        self.ledger_entries = ledger_entries
        count = (entries + ledger_entries - 1) // ledger_entries
        self._ids = list(range(first_ledger, first_ledger + count))
        self._counts = {lg: min(ledger_entries, entries - i * ledger_entries) for i, lg in enumerate(self._ids)}

    def global_index(self, pos: Position) -> int:
        return (pos[0] - self._ids[0]) * self.ledger_entries + pos[1]

    def position(self, index: int) -> Position:
        return Position(self._ids[0] + index // self.ledger_entries, index % self.ledger_entries)

    def next_position(self, pos: Position) -> Position:
        ledger, entry = pos
        n = self._counts.get(ledger)
        if n is not None and entry + 1 < n:
            return Position(ledger, entry + 1)
        i = bisect.bisect_right(self._ids, ledger)
        if i < len(self._ids):
            return Position(self._ids[i], 0)
        last = self._ids[-1]
        return Position(last, self._counts[last] if ledger < last else entry + 1)

    def previous_position(self, pos: Position) -> Position:
        return Position(pos[0], pos[1] - 1 if pos[1] > 0 else -1)

    def first_position(self) -> Position:
        return Position(self._ids[0], 0)

    @property
    def last_confirmed(self) -> Position:
        return Position(self._ids[-1], self._counts[self._ids[-1]] - 1)

    def ledger_ids(self) -> list[int]:
        return list(self._ids)

    def entries_in(self, ledger_id: int) -> int | None:
        return self._counts.get(ledger_id)

    def entries_between(self, a: Position, b: Position) -> int:
        def index(p: Position) -> int:
            if p[0] < self._ids[0]:
                return -1
            if p[0] > self._ids[-1]:
                return self.entries - 1
            return self.global_index(Position(p[0], min(p[1], self._counts[p[0]] - 1)))
        return max(0, index(b) - index(a))

    def contains(self, pos: Position) -> bool:
        n = self._counts.get(pos[0])
        return n is not None and 0 <= pos[1] < n


# ---------------------------------------------------------------------------------------------- a broker
@dataclass
class InProcessBroker:
    """The broker side of the cursor in this process, wired as cli/broker_cmd.py wires `bksim broker run`."""
    client: object
    store: object
    transport: object
    service: object

    @staticmethod
    async def connect(zk_hosts: str, config: Config, log: Callable[[str], None]) -> "InProcessBroker":
        from bksim.adapters import registration
        from bksim.adapters.bookie_transport import GrpcBookieTransport, registration_resolver
        from bksim.adapters.clock import SystemClock
        from bksim.adapters.zk_metadata import ZkMetadataStore
        from bksim.broker.ledgers import LedgerService

        client = await asyncio.to_thread(registration.connect_config, config, ZK_CONNECT_TIMEOUT_S,
                                         zk_hosts)
        store = ZkMetadataStore(client, operation_timeout_ms=config.zookeeper.operation_timeout_ms,
                                read_tries_max=config.zookeeper.read_tries_max)
        r = config.broker
        transport = GrpcBookieTransport(registration_resolver(store), timeout_ms=r.bookie_timeout_ms,
                                        add_window_max=r.add_window_max)
        service = LedgerService(store=store, transport=transport, rng=random.SystemRandom(), clock=SystemClock(),
                                config=r, log=log)
        return InProcessBroker(client, store, transport, service)

    async def close(self) -> None:
        await self.service.close(close_ledgers=False)
        await self.transport.close()
        self.store.close()

        def stop() -> None:
            try:
                self.client.stop()
            finally:
                self.client.close()
        await asyncio.to_thread(stop)


# ---------------------------------------------------------------------------------------------- the round trip
@dataclass
class Report:
    entries: int
    pattern: str
    acked: int
    holes: int
    ranges: int
    ack_s: float
    ack_batches: list[tuple[float, int]]  # (seconds, positions) per ack() call
    state_bytes: int
    persist_s: float
    snapshot_bytes: int
    snapshot_payload_bytes: int
    snapshot_entries: int
    recover_kill_s: float
    close_s: float
    close_snapshot_bytes: int
    recover_clean_s: float
    recovered_kill: dict = field(default_factory=dict)   # stats of the cursor B recovered
    recovered_clean: dict = field(default_factory=dict)  # stats of the cursor C recovered
    holes_after_kill: int = -1
    holes_after_clean: int = -1

    @property
    def ack_us(self) -> float:
        return self.ack_s / self.acked * 1e6 if self.acked else 0.0


def _batches(layout: FixedLayout, pattern: str, seed: int):
    """Lists of positions to ack, at most ACK_BATCH each, in log order."""
    rng = random.Random(seed)
    for ledger in layout.ledger_ids():
        n = layout.entries_in(ledger)
        base = layout.global_index(Position(ledger, 0))
        for start in range(0, n, ACK_BATCH):
            stop = min(n, start + ACK_BATCH)
            if pattern == "alternate":
                first = start + ((base + start + 1) % 2)  # odd global indexes
                yield [Position(ledger, e) for e in range(first, stop, 2)]
            else:
                yield [Position(ledger, e) for e in range(start, stop) if rng.random() < 0.5
                       and base + e > 0]  # global entry 0 stays unacked: mark-delete stays at the start


def _expected(cursor: ManagedCursor) -> dict[int, bytes]:
    return {lg: bytes(cursor.state.ledger_bits(lg)).rstrip(b"\x00") for lg in cursor.state.acked_ledgers()}


def _compare(expected: dict[int, bytes], cursor: ManagedCursor, when: str) -> None:
    got = _expected(cursor)
    if got.keys() != expected.keys():
        missing = sorted(set(expected) - set(got))[:5]
        extra = sorted(set(got) - set(expected))[:5]
        raise RuntimeError(f"{when}: acked ledgers differ (missing {missing}, extra {extra})")
    for lg, bits in expected.items():
        if got[lg] != bits:
            at = next(i for i, (a, b) in enumerate(zip(got[lg] + bytes(len(bits)), bits)) if a != b)
            raise RuntimeError(f"{when}: acks of ledger {lg} differ from entry {at * 8} on")


async def roundtrip(brokers: Callable[[], Awaitable[InProcessBroker]], layout: FixedLayout, topic: TopicConfig,
                    pattern: str = "alternate", seed: int = 1, log: Callable[[str], None] = lambda line: None,
                    idle: Callable[[str], float] = lambda label: 1.0, ml_path: str = ML_PATH) -> Report:
    """Steps 1-5 of the module docstring; the brokers it gets from `brokers()` are closed before it returns.
    `ml_path`: the managed ledger's znode, under which the cursor's is made (a run on a shared ZooKeeper passes a
    path of its own, so a failed run's cursor is no other run's concern)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern {pattern!r} is not one of {PATTERNS}")
    path = f"{ml_path}/{CURSOR_NAME}"
    opened: list[InProcessBroker] = []

    async def broker() -> InProcessBroker:
        b = await brokers()
        opened.append(b)
        return b

    async def open_cursor(b: InProcessBroker) -> ManagedCursor:
        return await ManagedCursor.open(name=CURSOR_NAME, path=path, layout=layout, ledgers=b.service, store=b.store,
                                        clock=_clock(), config=topic, initial_position="earliest", log=log,
                                        background_flush=False)

    try:
        a_broker = await broker()
        if await a_broker.store.exists(path) is not None:
            raise RuntimeError(f"{path} exists already: a cursor of an earlier run?")
        if await a_broker.store.exists(ml_path) is None:
            await a_broker.store.create(ml_path, b"{}", make_parents=True)
        a = await open_cursor(a_broker)
        idle("ack")
        ack_s, per_batch = 0.0, []
        for positions in _batches(layout, pattern, seed):
            t0 = time.perf_counter()
            a.ack(positions)
            dt = time.perf_counter() - t0
            ack_s += dt
            per_batch.append((dt, len(positions)))
        acked = a.state.acked_count
        holes = a.backlog()
        if pattern == "alternate" and (acked, holes) != (layout.entries // 2, layout.entries - layout.entries // 2):
            raise RuntimeError(f"acked {acked} entries leaving {holes} holes; expected every other one")
        expected = _expected(a)
        ranges = a.state.range_count()
        state_bytes = a.state.memory_bytes()

        idle("persist")
        t0 = time.perf_counter()
        await a.persist(force=True)
        persist_s = time.perf_counter() - t0
        persisted = a.stats_internal()["lastPersist"]
        a.abort("killed (kill -9): nothing more is written")

        b_broker = await broker()
        idle("recover after kill")
        t0 = time.perf_counter()
        b = await open_cursor(b_broker)
        recover_kill_s = time.perf_counter() - t0
        b_stats = b.stats_internal()
        if b_stats["recovery"]["source"] != "ledger":
            raise RuntimeError(f"after the kill the cursor recovered from {b_stats['recovery']}")
        _compare(expected, b, "after the kill")
        holes_after_kill = b.backlog()

        t0 = time.perf_counter()
        await b.close()
        close_s = time.perf_counter() - t0
        close_bytes = b.stats_internal()["lastPersist"].get("bytes", 0)

        c_broker = await broker()
        idle("recover after clean close")
        t0 = time.perf_counter()
        c = await open_cursor(c_broker)
        recover_clean_s = time.perf_counter() - t0
        c_stats = c.stats_internal()
        _compare(expected, c, "after the clean close")
        holes_after_clean = c.backlog()
        await c.delete()
        return Report(layout.entries, pattern, acked, holes, ranges, ack_s, per_batch,
                      state_bytes, persist_s, persisted["bytes"], persisted["payloadBytes"], persisted["entries"],
                      recover_kill_s, close_s, close_bytes, recover_clean_s, b_stats, c_stats, holes_after_kill,
                      holes_after_clean)
    finally:
        for b in reversed(opened):
            await b.close()


def _clock():
    from bksim.adapters.clock import SystemClock
    return SystemClock()


# ---------------------------------------------------------------------------------------------- the benchmark
async def wait_bookies(cluster, broker: InProcessBroker) -> None:
    """Wait (bounded) until every bookie of `cluster` (a perf.ledger_write.LedgerCluster) is registered writable,
    as `broker` sees them."""
    from bksim.perf.ledger_write import CLUSTER_READY_TIMEOUT_S

    deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
    while len(await broker.service.writable_bookies()) < len(cluster.bookies):
        cluster.check_alive()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{len(cluster.bookies)} bookies not registered after {CLUSTER_READY_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.1)


def measure(workdir: str, entries: int, ledger_entries: int, pattern: str, bookies: int, idle_guard, config: Config,
            config_path: str | None = None, keep: bool = False, log: Callable[[str], None] = lambda line: None
            ) -> tuple[list[Result], Report]:
    """Start ZooKeeper and `bookies` bookies, run roundtrip(), stop everything; Results for the table."""
    topic = replace(config.topic, ensemble_size=min(config.topic.ensemble_size, bookies),
                    write_quorum_size=min(config.topic.write_quorum_size, bookies),
                    ack_quorum_size=min(config.topic.ack_quorum_size, bookies))
    layout = FixedLayout(entries, ledger_entries)
    from bksim.perf.ledger_write import LedgerCluster

    with LedgerCluster(workdir, bookies, config, config_path, keep, brokers=0) as cluster:
        async def main() -> Report:
            probe = await InProcessBroker.connect(cluster.zk_connect, config, log)
            try:
                await wait_bookies(cluster, probe)
            finally:
                await probe.close()
            return await roundtrip(lambda: InProcessBroker.connect(cluster.zk_connect, config, log), layout, topic,
                                   pattern, log=log, idle=idle_guard)
        report = run_interruptible(main())
    return results(report), report


def results(r: Report) -> list[Result]:
    extra_common = {"entries": r.entries, "pattern": r.pattern}
    out = []
    acks = LatencyRecorder()
    for seconds, n in r.ack_batches:
        if n:
            acks.add(seconds / n, n)
    out.append(make_result("cursor-ack", 0, ACK_BATCH, r.ack_s, acks, 1.0,
                           {**extra_common, "acked": r.acked, "holes": r.holes, "ranges": r.ranges,
                            "ack_us": r.ack_us, "state_bytes": r.state_bytes}))
    for name, seconds, extra in (
            ("cursor-persist", r.persist_s, {"snapshot_bytes": r.snapshot_bytes,
                                             "snapshot_payload_bytes": r.snapshot_payload_bytes,
                                             "snapshot_entries": r.snapshot_entries}),
            ("recover-kill", r.recover_kill_s, {"holes_recovered": r.holes_after_kill,
                                                       "entries_read": r.recovered_kill["recovery"].get("entriesRead")}),
            ("cursor-close", r.close_s, {"snapshot_bytes": r.close_snapshot_bytes}),
            ("recover-clean", r.recover_clean_s, {"holes_recovered": r.holes_after_clean})):
        one = LatencyRecorder()
        one.add(seconds)
        out.append(make_result(name, 0, 1, seconds, one, 1.0, {**extra_common, **extra}))
    return out


def targets(r: Report) -> list[dict]:
    applies = r.entries == TARGET_ENTRIES and r.pattern == "alternate"
    value = (f"{r.holes:,} holes of {r.entries:,} entries; after kill {r.holes_after_kill:,}, after clean restart "
             f"{r.holes_after_clean:,}; snapshot {r.snapshot_bytes:,} B, persist {r.persist_s * 1000:.1f} ms, "
             f"recover {r.recover_kill_s * 1000:.1f} ms (kill) / {r.recover_clean_s * 1000:.1f} ms (clean)")
    met = r.holes_after_kill == r.holes_after_clean == r.holes
    return [{"target": f"{TARGET_ENTRIES:,} entries, every other one acked: all {TARGET_ENTRIES // 2:,} holes survive "
                       f"a kill and a clean restart",
             "value": value + ("" if applies else " (not the target's size/pattern)"),
             "met": met if applies else None}]
