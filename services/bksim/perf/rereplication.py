"""rereplication: how fast autorecovery restores a bookie lost for good, next to ledger-write in the same run.

The cluster: perf.ledger_write.LedgerCluster (the shared launcher, adapters.local_cluster) with 5 bookies and one
broker under the benchmark's temp dir; autorecovery (an auditor candidate and a replication worker;
lost_bookie_recovery_delay_ms 0, the auditor's bookie poll every 200 ms) runs either inside every bookie process
(`standalone_workers` 0, the default deployment: autorecovery.enabled) or, with `standalone_workers` N > 0, in N
`bksim autorecovery run` processes started under `nice -n worker_nice` while the bookies run none (BookKeeper's
standalone AutoRecoveryMain: the copy no longer shares the bookies' event loop and GIL, and yields the CPU to them).
Every process is stopped by pid whatever happens.

1. ledger-write: closed loop, E=3 Qw=3 Qa=2, `entry_bytes` entries on a fresh ledger for `seconds` (as
   `perf ledger-write`): the rate the copy is compared with. That ledger is then deleted, so the data ledgers
   are the only closed ones the loss marks: the workers copy exactly the entries counted below.
2. The data: closed ledgers (the data shape, default E=3 Qw=2 Qa=2) of `entry_bytes` entries totalling `size`
   bytes, written through the broker (closed loop) and closed.
3. A concurrent writer: open loop at `writer_rate` entries/s on an E=3 Qw=3 Qa=2 ledger whose ensemble leaves
   out the bookie that will be lost (so its latency shows the copy's load, not an ensemble change); its p99
   over `seconds` before the loss is the baseline.
4. The loss: kill -9 of the bookie named by the most data ledgers outside the writer's ensemble, never
   restarted. ZooKeeper is polled (every POLL_S) for the marks and the data ledgers' metadata until no mark is
   left and no data ledger names that bookie (bounded by REPLICATION_TIMEOUT_S); the writer keeps writing
   meanwhile and its latencies from the first mark seen to the end form the second p99 (between the kill and
   the mark the lost bookie's ZooKeeper session is still expiring: nothing is copied yet).

Figures: time from the first mark (its ctime_ms, written by the auditor) to full replication, and from the kill;
entries copied (those the lost bookie held by its write sets, from the metadata before the kill) and the copy
rate = copied / time from the mark; the cores the surviving bookies, the standalone workers and the whole machine
used from the first mark seen to the end; where the workers ran (the result's `workers`). Targets on this
machine: copy rate >= 0.5x the ledger-write rate; the concurrent writer's p99 during the re-replication <= 2x its
p99 without.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Callable

from bksim.adapters.broker_client import BrokerClient
from bksim.adapters.clock import SystemClock
from bksim.adapters import processes
from bksim.adapters.local_cluster import child_argv, stop_pids
from bksim.adapters.zk_metadata import ZkMetadataStore
from bksim.autorecovery.marks import UnderReplicationMarks
from bksim.metadata.ledger_manager import read_ledger_metadata
from bksim.metadata.ledger_metadata import LedgerMetadata
from bksim.model.config import Config
from bksim.perf.ledger_write import (CALL_DEADLINE_S, PASSWORD, RESPONSE_TIMEOUT_S, CpuMeter, LedgerCluster, Shape,
                                     drive_appends)
from bksim.perf.machine import idle_fraction, read_cpu_times
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import LatencyRecorder, Result, make_result

BOOKIES = 5
WRITER_SHAPE = Shape(3, 3, 2)  # ledger-write's and the concurrent writer's
DATA_SHAPE_DEFAULT = Shape(3, 2, 2)
LEDGER_BYTES = 64 * 2**20  # data bytes per ledger (at least 4 ledgers)
LEDGERS_MIN = 4
BATCH = 100
WINDOW = 16
WRITER_BATCH = 10
WRITER_RATE_DEFAULT = 1_000.0
POLL_S = 0.1
REPLICATION_TIMEOUT_S = 1_800.0
TARGET_COPY_RATIO = 0.5
TARGET_P99_RATIO = 2.0
CHILD_ENV = {
    "BKSIM_AUTORECOVERY_ENABLED": "true",
    "BKSIM_AUTORECOVERY_LOST_BOOKIE_RECOVERY_DELAY_MS": "0",
    "BKSIM_AUTORECOVERY_BOOKIE_CHECK_INTERVAL_MS": "200",
    "BKSIM_AUTORECOVERY_WORKER_BACKOFF_MS": "300",
}
WORKER_NICE_DEFAULT = 10
WORKER_STOP_S = 10.0


class _Workers:
    """`count` standalone `bksim autorecovery run` processes (under `nice -n nice_level`) on `cluster`: started
    by start(), stopped by pid (SIGTERM, bounded wait, SIGKILL) by stop(); their logs beside the cluster's."""

    def __init__(self, cluster: LedgerCluster, count: int, nice_level: int) -> None:
        self.cluster = cluster
        self.count = count
        self.nice_level = nice_level
        self.pids: list[int] = []

    def start(self) -> None:
        env = {**self.cluster.base_env(), **CHILD_ENV}
        nice = ["nice", "-n", str(self.nice_level)] if self.nice_level else []
        for i in range(1, self.count + 1):
            name = f"autorecovery-{i}"
            argv = [*nice, *child_argv("autorecovery", self.cluster.config_path), "--id", name]
            with processes.interrupts_deferred():  # a Ctrl-C between the fork and the append would orphan it
                self.pids.append(processes.spawn(argv, env, self.cluster.log_path(name), self.cluster.pid_path(name)))

    def cpu_s(self) -> float:
        return sum(processes.cpu_seconds(pid) for pid in self.pids if processes.is_alive(pid))

    def check_alive(self) -> None:
        for i, pid in enumerate(self.pids, 1):
            if not processes.is_alive(pid):
                raise RuntimeError(f"autorecovery-{i} (pid {pid}) exited; its log:\n"
                                   f"{processes.tail(self.cluster.log_path(f'autorecovery-{i}'), 30)}")

    def stop(self) -> list[str]:
        return stop_pids([(f"autorecovery-{i}", pid, self.cluster.pid_path(f"autorecovery-{i}"))
                          for i, pid in enumerate(self.pids, 1)], None, WORKER_STOP_S)

    def describe(self) -> str:
        if not self.count:
            return f"in each of the {BOOKIES} bookie processes (autorecovery.enabled)"
        return (f"{self.count} standalone `bksim autorecovery run` process{'es' if self.count > 1 else ''}"
                f"{f' at nice {self.nice_level}' if self.nice_level else ''}; bookies without autorecovery")


def measure(workdir: str, size_bytes: int, entry_bytes: int, seconds: float, writer_rate: float, data_shape: Shape,
            idle_guard: Callable[[str], float], config: Config, config_path: str | None = None,
            keep: bool = False, log: Callable[[str], None] = print, standalone_workers: int = 0,
            worker_nice: int = WORKER_NICE_DEFAULT) -> tuple[list[Result], list[dict]]:
    """(results: ledger-write, writer without, writer during, rereplication; targets). `standalone_workers` > 0:
    the bookies run no autorecovery and that many `bksim autorecovery run` processes (at `worker_nice`) do."""
    assert standalone_workers >= 0 and 0 <= worker_nice <= 19
    env = dict(CHILD_ENV, BKSIM_AUTORECOVERY_ENABLED="false") if standalone_workers else dict(CHILD_ENV)
    with LedgerCluster(workdir, BOOKIES, config, config_path, keep, child_env=env) as cluster:
        workers = _Workers(cluster, standalone_workers, worker_nice if standalone_workers else 0)
        log(f"# autorecovery: {workers.describe()}")
        try:
            workers.start()
            results = run_interruptible(_measure(cluster, workers, size_bytes, entry_bytes, seconds, writer_rate,
                                                 data_shape, idle_guard, log))
        finally:
            for failure in workers.stop():
                log(f"# {failure} did not stop")
    return results, targets(results)


async def _measure(cluster: LedgerCluster, workers: _Workers, size_bytes: int, entry_bytes: int, seconds: float, writer_rate: float,
                   data_shape: Shape, idle_guard: Callable[[str], float], log: Callable[[str], None]) -> list[Result]:
    zk = cluster.kazoo()
    store = ZkMetadataStore(zk)
    try:
        async with BrokerClient(cluster.broker_address, deadline_s=CALL_DEADLINE_S) as client:
            await cluster.wait_serving(client, BOOKIES)
            write = await _ledger_write(cluster, client, entry_bytes, seconds, idle_guard)
            log(f"# ledger-write: {write.records_per_s:,.0f} entries/s")
            data, entries = await _write_data(client, size_bytes, entry_bytes, data_shape)
            log(f"# data: {len(data)} closed ledgers ({data_shape}), {entries:,} entries of {entry_bytes} B")
            return [write] + await _lose_one(cluster, workers, client, store, data, entry_bytes, seconds,
                                             writer_rate, idle_guard, log)
    finally:
        store.close()
        zk.stop()
        zk.close()


async def _ledger_write(cluster: LedgerCluster, client: BrokerClient, entry_bytes: int, seconds: float,
                        idle_guard: Callable[[str], float]) -> Result:
    info = await client.create_ledger(*_sizes(WRITER_SHAPE), password=PASSWORD)
    idle = idle_guard("ledger-write")
    meter = CpuMeter(cluster)
    meter.start()
    stream = client.append_stream(info.ledger_id, password=PASSWORD, window_max=WINDOW,
                                  response_timeout_s=RESPONSE_TIMEOUT_S)
    run = await drive_appends(stream, entry_bytes, BATCH, seconds, 0, None)
    cpu = meter.stop(run.elapsed_s)
    await client.close_ledger(info.ledger_id, password=PASSWORD)
    await client.delete_ledger(info.ledger_id, password=PASSWORD)  # not copied after the loss: not counted either
    extra = {"mode": "closed-loop", "ensemble": 3, "write_quorum": 3, "ack_quorum": 2, "window": WINDOW, **cpu}
    return make_result("ledger-write", entry_bytes, BATCH, run.elapsed_s, run.latencies, idle, extra)


def _sizes(shape: Shape) -> tuple[int, int, int]:
    return shape.ensemble, shape.write_quorum, shape.ack_quorum


async def _write_data(client: BrokerClient, size_bytes: int, entry_bytes: int,
                      shape: Shape) -> tuple[list[int], int]:
    total = max(1, -(-size_bytes // entry_bytes))
    count = max(LEDGERS_MIN, -(-size_bytes // LEDGER_BYTES))
    per = [total // count + (1 if i < total % count else 0) for i in range(count)]
    ledgers = []
    for n in per:
        if n <= 0:
            continue
        info = await client.create_ledger(*_sizes(shape), password=PASSWORD)
        stream = client.append_stream(info.ledger_id, password=PASSWORD, window_max=WINDOW,
                                      response_timeout_s=RESPONSE_TIMEOUT_S)
        run = await drive_appends(stream, entry_bytes, BATCH, 0, n, None)
        closed = await client.close_ledger(info.ledger_id, password=PASSWORD)
        if closed.state != "CLOSED" or closed.last_entry_id != run.entries_acked - 1 or run.entries_acked != n:
            raise RuntimeError(f"data ledger {info.ledger_id}: {run.entries_acked} of {n} entries acknowledged, "
                               f"closed as {closed.state} at {closed.last_entry_id}")
        ledgers.append(info.ledger_id)
    return ledgers, sum(per)


def held_entries(md: LedgerMetadata, bookie: str) -> int:
    """Entries of a CLOSED ledger whose write set includes `bookie` (what it held, what must be copied)."""
    return sum(1 for e in range(md.last_entry_id + 1) if bookie in md.write_set(e))


class _Writer:
    """Open loop: batch k due at start + k * batch / rate, latency from the due time into the recorder current
    when the batch was due (the phase: before the loss; from the loss until the first mark is seen, while the
    lost bookie's session has not yet expired: not reported; during the re-replication)."""

    def __init__(self, stream, entry_bytes: int, rate: float) -> None:
        self.stream = stream
        self.payloads = [os.urandom(entry_bytes)] * WRITER_BATCH
        self.interval = WRITER_BATCH / rate
        self.phases = {"without": LatencyRecorder(), "unnoticed": LatencyRecorder(), "during": LatencyRecorder()}
        self.phase = "without"
        self.stop = asyncio.Event()
        self.acked = 0
        self.mismatch = ""

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        futures = []
        start = loop.time()
        k = sent = 0
        while not self.stop.is_set():
            due = start + k * self.interval
            now = loop.time()
            if due > now:
                try:
                    await asyncio.wait_for(self.stop.wait(), due - now)
                    break
                except TimeoutError:
                    pass
            future = await self.stream.send(self.payloads)
            future.add_done_callback(lambda f, t=due, first=sent, rec=self.phases[self.phase]:
                                     self._done(f, t, first, rec, loop))
            futures.append(future)
            sent += WRITER_BATCH
            k += 1
            if len(futures) > 4096:
                futures = [f for f in futures if not f.done()]
        await asyncio.gather(*futures)
        await asyncio.sleep(0)
        await self.stream.close()
        if self.mismatch:
            raise RuntimeError(f"concurrent writer: {self.mismatch}")

    def _done(self, future, due: float, first: int, rec: LatencyRecorder, loop) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        r = future.result()
        if (r.first_entry_id, r.count) != (first, WRITER_BATCH) and not self.mismatch:
            self.mismatch = f"answered {r.first_entry_id}+{r.count}, expected {first}+{WRITER_BATCH}"
        self.acked += r.count
        rec.add(max(0.0, loop.time() - due), r.count)


async def _lose_one(cluster: LedgerCluster, workers: _Workers, client: BrokerClient, store: ZkMetadataStore, data: list[int],
                    entry_bytes: int, seconds: float, writer_rate: float, idle_guard: Callable[[str], float],
                    log: Callable[[str], None]) -> list[Result]:
    before = {lid: (await read_ledger_metadata(store, lid))[0] for lid in data}
    info = await client.create_ledger(*_sizes(WRITER_SHAPE), password=PASSWORD)
    writer_ensemble = set((await read_ledger_metadata(store, info.ledger_id))[0].segments[0].ensemble)
    outside = [b for b in cluster.bookies if b.node_id not in writer_ensemble]
    victim = max(outside, key=lambda b: (sum(held_entries(md, b.node_id) for md in before.values()), b.name))
    copied = sum(held_entries(md, victim.node_id) for md in before.values())
    naming = [lid for lid, md in before.items() if any(victim.node_id in s.ensemble for s in md.segments)]
    idle = idle_guard("concurrent writer")
    stream = client.append_stream(info.ledger_id, password=PASSWORD, window_max=WINDOW,
                                  response_timeout_s=RESPONSE_TIMEOUT_S)
    writer = _Writer(stream, entry_bytes, writer_rate)
    task = asyncio.create_task(writer.run())
    try:
        await asyncio.sleep(seconds)  # the writer's baseline: `seconds` of its latencies without re-replication
        marks = UnderReplicationMarks(store, SystemClock())
        writer.phase = "unnoticed"
        killed_wall_ms, killed = time.time() * 1000, time.monotonic()
        cluster.kill9(victim)
        log(f"# kill -9 {victim.name} ({victim.node_id}): named by {len(naming)} of {len(data)} data ledgers, "
            f"{copied:,} entries to copy")
        first_mark_ms = None
        marked = None
        cpu_at_mark: tuple[dict[str, float], float, object] | None = None
        marked_ids: set[int] = set()  # every ledger seen marked: the data ledgers naming the victim, no other
        deadline = killed + REPLICATION_TIMEOUT_S
        while True:
            if task.done():
                task.result()  # the writer failed: raise it
            workers.check_alive()
            listed = await marks.list()
            marked_ids.update(m.ledger_id for m in listed)
            if listed:
                if writer.phase == "unnoticed":
                    writer.phase, marked = "during", time.monotonic()
                    cpu_at_mark = (cluster.cpu_s(), workers.cpu_s(), read_cpu_times())
                first = min(m.ctime_ms for m in listed)
                first_mark_ms = first if first_mark_ms is None else min(first_mark_ms, first)
            if not listed:
                still = [lid for lid in naming
                         if any(victim.node_id in s.ensemble
                                for s in (await read_ledger_metadata(store, lid))[0].segments)]
                if not still:
                    break
            if time.monotonic() >= deadline:
                raise RuntimeError(f"not fully replicated {REPLICATION_TIMEOUT_S:.0f} s after the loss of "
                                   f"{victim.name}: marks {[m.ledger_id for m in listed][:10]};\n{cluster.logs()}")
            await asyncio.sleep(POLL_S)  # polling ZooKeeper: the marks and the metadata
        done_wall_ms, done = time.time() * 1000, time.monotonic()
        cpu = _copy_cpu(cluster, workers, cpu_at_mark, done - marked if marked is not None else 0.0)
    finally:
        writer.stop.set()
        await asyncio.wait_for(task, RESPONSE_TIMEOUT_S + 5)
    await client.close_ledger(info.ledger_id, password=PASSWORD)
    from_mark_s = (done_wall_ms - (first_mark_ms if first_mark_ms is not None else killed_wall_ms)) / 1000
    from_kill_s = done - killed
    copy = LatencyRecorder()
    copy.add(from_mark_s, max(1, copied))
    extra = {"mode": "rereplication", "lost_bookie": victim.node_id, "ledgers": len(data),
             "ledgers_naming_lost": len(naming), "ledgers_marked_seen": len(marked_ids), "entries_copied": copied, "from_mark_s": from_mark_s,
             "from_kill_s": from_kill_s, "mark_seen": first_mark_ms is not None,
             "copy_entries_per_s": copied / from_mark_s if from_mark_s > 0 else 0.0,
             "workers": workers.describe(), "standalone_worker_pids": ",".join(map(str, workers.pids)), **cpu}
    out = []
    spans = {"without": seconds, "during": done - marked if marked is not None else 0.0}
    for phase, span in spans.items():
        rec = writer.phases[phase]
        if rec.records:
            out.append(make_result(f"writer-{phase}-rereplication", entry_bytes, WRITER_BATCH, span, rec, idle,
                                   {"mode": "open-loop", "rate_target_per_s": writer_rate, "ensemble": 3,
                                    "write_quorum": 3, "ack_quorum": 2}))
    out.append(make_result("rereplication", entry_bytes, 1, max(from_mark_s, 1e-6), copy, idle, extra))
    return out


def _copy_cpu(cluster: LedgerCluster, workers: _Workers, at_mark, span_s: float) -> dict[str, float | None]:
    """Cores used from the first mark seen to the end: the surviving bookies, the standalone workers, the whole
    machine (None without a mark)."""
    if at_mark is None or span_s <= 0:
        return {}
    before, workers_before, machine_before = at_mark
    after = cluster.cpu_s()
    bookies = sum(after[b.name] - before[b.name] for b in cluster.bookies if b.name in after and b.name in before)
    idle = idle_fraction(machine_before, read_cpu_times())
    cores = len(os.sched_getaffinity(0))
    return {"copy_bookies_cpu_cores": bookies / span_s,
            "copy_workers_cpu_cores": (workers.cpu_s() - workers_before) / span_s,
            "copy_machine_busy_cores": None if idle is None else (1.0 - idle) * cores}


def targets(results: list[Result]) -> list[dict]:
    by = {r.name: r for r in results}
    out = []
    write, copy = by.get("ledger-write"), by.get("rereplication")
    if write and copy:
        rate = copy.extra["copy_entries_per_s"]
        ratio = rate / write.records_per_s if write.records_per_s else 0.0
        out.append({"target": f"copy rate >= {TARGET_COPY_RATIO:g}x ledger-write",
                    "value": f"{rate:,.0f} entries/s copied ({copy.extra['entries_copied']:,} in "
                             f"{copy.extra['from_mark_s']:.2f} s from the mark) vs {write.records_per_s:,.0f} "
                             f"entries/s written: {ratio:.2f}x", "met": ratio >= TARGET_COPY_RATIO})
    without, during = by.get("writer-without-rereplication"), by.get("writer-during-rereplication")
    if without and during:
        ratio = during.p99_ms / without.p99_ms if without.p99_ms else float("inf")
        out.append({"target": f"concurrent E=3 Qw=3 Qa=2 writer p99 <= {TARGET_P99_RATIO:g}x without re-replication",
                    "value": f"p99 {during.p99_ms:.1f} ms during vs {without.p99_ms:.1f} ms without: {ratio:.2f}x",
                    "met": ratio <= TARGET_P99_RATIO})
    else:
        out.append({"target": f"concurrent E=3 Qw=3 Qa=2 writer p99 <= {TARGET_P99_RATIO:g}x without re-replication",
                    "value": "the writer acknowledged nothing in one of the phases", "met": None})
    return out
