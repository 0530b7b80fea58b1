"""compaction: the bookie's entry-log compaction (bookie/compaction.py) against a raw scan of the same log, and a
concurrent writer's add latency without and during compaction; all in one run, on one in-process engine.

One BookieEngine (bookie/engine.py) in-process on real files and a real RocksDB (LocalDisk, open_rocks, the system
clock), under the benchmark's temp dir (same disk as the bookies' data); every option is the configuration's
except `entry_log_bytes_max` = `--log-mb` MiB, so the fill seals logs of that size. No gRPC: compaction and the
writer must share one engine (one event loop, one disk), which is what a bookie's adds and its compaction share;
the gRPC hop would add the same constant to both writer phases.

1. Fill: LEDGERS ledgers, `entry_bytes`-byte entries (36-byte header + payload), round robin in add batches of
   up to FILL_BATCH entries of one ledger (journal synced), until 1 + `during_logs` logs are sealed; a checkpoint writes them. Each
   checkpoint lays a ledger's cached entries out as one run, so a log is a sequence of per-ledger runs, as on a
   busy bookie. Then `delete_ledgers` drops all but round(`live` x LEDGERS) ledgers (garbage collection's local
   step: the metadata store is not involved) and `refresh_log_meta` records the sealed logs.
2. entrylog-scan (the baseline): EntryLogger.records() over the first sealed log, every record's bytes taken (what
   compaction reads), nothing written. records = records read; MB/s = records x entry bytes / s.
3. compaction: `engine.compact_log` of the first log, unthrottled: copy, fsync, rename, synced index batch, delete
   of the old log, metadata. records = live entries copied; MB/s = live MB/s copied (same unit as the scan).
   Ratio compaction / entrylog-scan: target >= 0.5x. A scan-driven compaction reads the whole log, so its live
   rate cannot pass `live` x the scan rate plus what it saves over the scan per dead record: at --live 0.25 the
   target needs compaction to spend less per dead record than the scan does.
4. writer-without-compaction / writer-during-compaction: an open-loop writer adds one entry of a fresh ledger every
   1/`writer_rate` s (a task per add; latency = due time -> durable ack), for `seconds` s alone, then while the
   other `during_logs` logs are compacted one after the other at the configured `compaction_rate_bytes_per_s` (the
   TokenBucket a bookie's garbage collector uses: its burst is one second's worth, so the first MiBs go at once).
   Target: p99 during <= 2x p99 without. The "during" phase lasts as long as those compactions.

Reported with the results: the 1-minute load average as each measurement started (the machine is shared), the
live fraction of the log as the engine counts it, the log's bytes, the bytes copied
and freed, the writer's adds and the compaction's duration and rate limit in the "during" phase.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from typing import Callable

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import index_opener
from bksim.bookie.engine import BookieEngine
from bksim.formats.entry import HEADER_BYTES, encode_entry
from bksim.model.config import Config
from bksim.model.status import StatusCode
from bksim.perf.machine import idle_noting_load
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import MB, LatencyRecorder, Ratio, Result, make_result, ratio
from bksim.ports.ratelimit import TokenBucket

TARGET_RATIO = 0.5  # compaction live MB/s over the raw scan's MB/s
TARGET_P99_RATIO = 2.0  # writer p99 during compaction over without
LEDGERS = 100  # the live fraction is quantised to 1/LEDGERS
FILL_BATCH = 256  # entries per add_entries call of the fill (one journal sync)
FILL_CONCURRENCY = 4
FILL_ROUNDS_MIN = 8  # every ledger gets at least this many batches (smaller batches for small logs)
WRITER_LEDGER_ID = 1_000_000
WRITER_RATE_DEFAULT = 1_000.0
WRITER_INFLIGHT_MAX = 10_000  # an open-loop writer whose adds pile up this high stops (the engine is stuck)
MASTER_KEY = b"perf-compaction-key!"
MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    log_mb: int
    live: float
    entry_bytes: int
    writer_rate: float
    seconds: float
    during_logs: int = 1

    def __post_init__(self) -> None:
        if self.log_mb < 1 or not 0 < self.live < 1 or self.entry_bytes < HEADER_BYTES + 1:
            raise ValueError(f"need log MiB >= 1, 0 < live < 1, entry bytes > {HEADER_BYTES}, got {self}")
        if self.writer_rate <= 0 or self.seconds <= 0 or self.during_logs < 1:
            raise ValueError(f"need writer rate > 0, seconds > 0 and during logs >= 1, got {self}")
        if round(self.live * LEDGERS) < 1:
            raise ValueError(f"live fraction {self.live} keeps no ledger of {LEDGERS}")


def measure(workdir: str, shape: Shape, idle: Callable[[str], float], config: Config,
            log: Callable[[str], None] = print) -> tuple[list[Result], list[Ratio], list[dict]]:
    """Fill, scan, compact, and the writer without/during compaction (module docstring); returns the figures."""
    return run_interruptible(_measure(workdir, shape, idle, config, log))


async def _measure(workdir: str, shape: Shape, idle: Callable[[str], float], config: Config,
                   log: Callable[[str], None]) -> tuple[list[Result], list[Ratio], list[dict]]:
    bookie_config = dataclasses.replace(config.bookie, entry_log_bytes_max=shape.log_mb * MiB)
    root = os.path.join(workdir, f"engine-{uuid.uuid4().hex[:8]}")
    logs: list[str] = []
    clock = SystemClock()
    engine = BookieEngine(bookie_config, disk=LocalDisk(), clock=clock,
                          open_kv=index_opener(bookie_config.index_write_buffer_bytes),
                          instance_id=str(uuid.uuid4()), journal_dir=os.path.join(root, "journal"),
                          ledger_dir=os.path.join(root, "ledgers"), log=logs.append)
    await engine.start()
    try:
        started = time.monotonic()
        first, *others = await _fill(engine, shape)
        stats = {s["log_id"]: s for s in engine.entry_log_stats()}
        log(f"# fill: {len(engine.gc_ledger_ids())} of {LEDGERS} ledgers live, sealed logs "
            + ", ".join(f"{i:x} ({stats[i]['bytes'] / MB:.1f} MB, live {stats[i]['live_ratio']:.3f})"
                        for i in [first, *others]) + f" in {time.monotonic() - started:.1f} s")
        loads: dict[str, float] = {}
        ready = idle_noting_load(idle, loads)

        scan = _scan(engine, first, shape, ready("entrylog-scan"))
        compacted = await _compact(engine, first, shape, stats[first], ready("compaction"))
        ledger = _WriterLedger(shape.entry_bytes)
        without = await _writer(engine, ledger, shape, shape.seconds, None, ready("writer-without-compaction"))
        rate = bookie_config.compaction_rate_bytes_per_s
        bucket = TokenBucket(clock, rate, rate) if rate > 0 else None
        during = await _writer(engine, ledger, shape, 0.0, lambda: _compact_all(engine, others, bucket),
                               ready("writer-during-compaction"))
        during.extra["compaction_rate_mb_per_s"] = rate / MB if rate else 0.0
    finally:
        await engine.close()
    bad = [line for line in logs if "internal error" in line or "failed" in line]
    if bad:
        raise RuntimeError(f"the engine logged failures: {bad[:3]}")
    results = [scan, compacted, without, during]
    for r in results:
        r.extra["load_avg_1m"] = loads[r.name]
    return results, [ratio(compacted, scan, TARGET_RATIO)], targets(results)


async def _fill(engine: BookieEngine, shape: Shape) -> list[int]:
    """Write until 1 + `during_logs` logs are sealed, checkpoint, delete all but the live ledgers; the sealed log
    ids, ascending."""
    payload = os.urandom(shape.entry_bytes - HEADER_BYTES)
    next_entry = [0] * LEDGERS
    length = [0] * LEDGERS
    logs = 1 + shape.during_logs
    target_bytes = logs * shape.log_mb * MiB + FILL_BATCH * (shape.entry_bytes + 4)
    batch = max(1, min(FILL_BATCH, target_bytes // (shape.entry_bytes + 4) // (LEDGERS * FILL_ROUNDS_MIN)))
    written = 0
    turn = 0

    async def one_batch(ledger: int) -> None:
        items = []
        for _ in range(batch):
            eid = next_entry[ledger]
            next_entry[ledger] = eid + 1
            length[ledger] += len(payload)
            items.append((encode_entry(ledger + 1, eid, eid - 1, length[ledger], payload), MASTER_KEY, 0))
        statuses, why = await engine.add_entries(items)
        if any(s is not StatusCode.OK for s in statuses):
            raise RuntimeError(f"fill: add to ledger {ledger + 1} failed: {why}")

    while written < target_bytes:
        ledgers = [(turn + i) % LEDGERS for i in range(FILL_CONCURRENCY)]
        turn += FILL_CONCURRENCY
        await asyncio.gather(*(one_batch(lid) for lid in ledgers))
        written += FILL_CONCURRENCY * batch * (shape.entry_bytes + 4)
    await engine.checkpoint()
    live = round(shape.live * LEDGERS)
    kept = {1 + i * LEDGERS // live for i in range(live)}  # spread over the ids, so over each log's runs
    doomed = [lid for lid in range(1, LEDGERS + 1) if lid not in kept]
    deleted = await engine.delete_ledgers(doomed, engine.gc_generation)
    assert sorted(deleted) == sorted(doomed), f"fill: deleted {len(deleted)} of {len(doomed)} ledgers"
    await engine.refresh_log_meta()
    sealed = [s["log_id"] for s in engine.entry_log_stats() if not s["current"]]
    if len(sealed) < logs:
        raise RuntimeError(f"fill: {len(sealed)} sealed log(s) after {written} bytes (want {logs})")
    return sealed[:logs]


def _scan(engine: BookieEngine, log_id: int, shape: Shape, cpu_idle: float) -> Result:
    logger = engine._entry_logger  # noqa: SLF001 - the benchmark reads the log as compaction does
    path = logger.path(log_id)
    records = nbytes = 0
    outcome: dict = {}
    started = time.perf_counter()
    for _offset, _lid, _eid, length, entry in logger.records(path, None, outcome):
        records += 1
        nbytes += len(entry)
    elapsed = time.perf_counter() - started
    if not outcome.get("clean") or nbytes != records * shape.entry_bytes:
        raise RuntimeError(f"scan of entry log {log_id:x} stopped early or found unexpected sizes")
    latencies = LatencyRecorder()
    latencies.add(elapsed, records)
    return make_result("entrylog-scan", shape.entry_bytes, 1, elapsed, latencies, cpu_idle,
                       {"log_bytes": os.path.getsize(path), "log_mb_per_s": os.path.getsize(path) / elapsed / MB})


async def _compact(engine: BookieEngine, log_id: int, shape: Shape, stats: dict, cpu_idle: float) -> Result:
    started = time.perf_counter()
    report = await engine.compact_log(log_id)
    elapsed = time.perf_counter() - started
    if report["kept_old"] or report["entries"] == 0:
        raise RuntimeError(f"compaction of entry log {log_id:x} did not complete: {report}")
    latencies = LatencyRecorder()
    latencies.add(elapsed, report["entries"])
    return make_result("compaction", shape.entry_bytes, 1, elapsed, latencies, cpu_idle,
                       {"live_ratio": stats["live_ratio"], "log_bytes": stats["bytes"],
                        "bytes_copied": report["bytes_copied"], "bytes_freed": report["bytes_freed"],
                        "log_mb_per_s": stats["bytes"] / elapsed / MB})


class _WriterLedger:
    """The writer's ledger: entry ids and lengths continue across its phases."""

    def __init__(self, entry_bytes: int) -> None:
        self._payload = os.urandom(entry_bytes - HEADER_BYTES)
        self._entry_id = 0
        self._length = 0

    def next_entry(self) -> bytes:
        eid = self._entry_id
        self._entry_id, self._length = eid + 1, self._length + len(self._payload)
        return encode_entry(WRITER_LEDGER_ID, eid, eid - 1, self._length, self._payload)


async def _compact_all(engine: BookieEngine, log_ids: list[int], bucket: TokenBucket | None) -> dict:
    """Compact the logs one after the other through one rate limit, as a GC round does; the summed report."""
    total = {"entries": 0, "bytes_copied": 0, "kept_old": False, "logs": len(log_ids)}
    for log_id in log_ids:
        report = await engine.compact_log(log_id, bucket.take if bucket is not None else None)
        total["entries"] += report["entries"]
        total["bytes_copied"] += report["bytes_copied"]
        total["kept_old"] |= report["kept_old"]
    return total


async def _writer(engine: BookieEngine, ledger: _WriterLedger, shape: Shape, seconds: float, background,
                  cpu_idle: float) -> Result:
    """Open loop: one single-entry add every 1/rate s for `seconds`, or while `background()` runs."""
    latencies = LatencyRecorder()
    failures: list[str] = []
    inflight: set[asyncio.Task] = set()
    name = "writer-during-compaction" if background is not None else "writer-without-compaction"

    async def add(entry: bytes, due: float) -> None:
        statuses, why = await engine.add_entries([(entry, MASTER_KEY, 0)])
        if statuses[0] is StatusCode.OK:
            latencies.add(time.perf_counter() - due)
        else:
            failures.append(why)

    interval = 1.0 / shape.writer_rate
    job = asyncio.ensure_future(background()) if background is not None else None
    started = time.perf_counter()
    due = started
    sent = 0
    try:
        while (time.perf_counter() - started < seconds) if job is None else not job.done():
            now = time.perf_counter()
            if now < due:
                await asyncio.sleep(due - now)
                continue
            if len(inflight) >= WRITER_INFLIGHT_MAX:
                raise RuntimeError(f"{name}: {len(inflight)} adds unanswered: the engine is stuck")
            task = asyncio.ensure_future(add(ledger.next_entry(), due))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            sent += 1
            due += interval
        if inflight:
            await asyncio.gather(*inflight)
        report = await job if job is not None else None
    finally:
        for task in list(inflight):
            task.cancel()
        if job is not None and not job.done():
            job.cancel()
    elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{name}: {len(failures)} add(s) failed: {failures[0]}")
    extra = {"offered_per_s": shape.writer_rate, "adds": sent}
    if report is not None:
        if report["kept_old"]:
            raise RuntimeError(f"compaction during the writer did not complete: {report}")
        extra.update(compaction_s=elapsed, logs_compacted=report["logs"], entries_copied=report["entries"])
    return make_result(name, shape.entry_bytes, 1, elapsed, latencies, cpu_idle, extra)


def targets(results: list[Result]) -> list[dict]:
    by = {r.name: r for r in results}
    out = []
    scan, compacted = by.get("entrylog-scan"), by.get("compaction")
    if scan and compacted:
        value = compacted.mb_per_s / scan.mb_per_s if scan.mb_per_s else 0.0
        out.append({"target": f"compaction live MB/s >= {TARGET_RATIO:g}x the raw entry-log scan",
                    "value": f"{compacted.mb_per_s:.1f} MB/s live copied (live {compacted.extra['live_ratio']:.2f}, "
                             f"{compacted.extra['log_mb_per_s']:.1f} MB/s of log) vs scan {scan.mb_per_s:.1f} MB/s: "
                             f"{value:.2f}x", "met": value >= TARGET_RATIO})
    without, during = by.get("writer-without-compaction"), by.get("writer-during-compaction")
    if without and during:
        value = during.p99_ms / without.p99_ms if without.p99_ms else float("inf")
        out.append({"target": f"writer add p99 during compaction <= {TARGET_P99_RATIO:g}x without",
                    "value": f"p99 {during.p99_ms:.2f} ms during ({during.records} adds) vs {without.p99_ms:.2f} ms "
                             f"without ({without.records} adds): {value:.2f}x", "met": value <= TARGET_P99_RATIO})
    return out
