"""The storage axes of `bksim perf scale` (perf/scale.py): ledgers per bookie, and entry size.

`ledgers`: a real ZooKeeper and one real `bksim bookie run` process (perf/ledger_write.LedgerCluster without a
broker), garbage collection and autorecovery off (`CHILD_ENV`: the ledgers exist on the bookie only, not in the
metadata, so a GC round would delete them). A baseline with no ledger, then for each point N, ledgers are added
until the bookie holds N: each ledger is one entry (id 0, ENTRY_PAYLOAD_BYTES of payload, its own master key record)
sent over one AddEntries stream (bookie_client.AddStream, LEDGER_BATCH entries of different ledgers per request,
LEDGER_INFLIGHT requests unanswered; every entry must be acknowledged OK, i.e. journal-synced). At each point: the
bookie's RSS, then a restart: SIGTERM (the bookie drains and checkpoints; `stop s`), the RocksDB index's bytes
(`<ledgers>/index`: SST, WAL, manifest; not RocksDB's text logs and options files, which grow with every open, not
with the data; the whole directory is `index_dir_mb` in the JSON) with the bookie stopped, the process started again
and timed until its gRPC health says SERVING (`start s`: journal replay, the index loaded, the first checkpoint,
registration), and the RSS once serving; RESTARTS restarts, the fastest kept. Per ledger: (value - the baseline's)
/ N. The gRPC path is fast enough for 100,000 ledgers (one entry each, batched), so the bookie is a real process and
its restart is a real restart.

`entry-size`: at each entry size (header included), three measurements of `seconds` each, as the existing
benchmarks make them: fsync-baseline (perf/fsync_baseline.py; GROUP = the entries a bookie has in flight, batch x
LEDGER_INFLIGHT, per write + fdatasync), grpc-baseline (perf/grpc_baseline.py, an echo server process) and
bookie-add (perf/bookie_add.py: a fresh ZooKeeper and bookie process per size), both with batch =
ENTRY_BATCH_BYTES / size entries per request (1..100) and LEDGER_INFLIGHT requests in flight. The ratios
bookie-add / fsync and bookie-add / gRPC of MB/s; the judged costs are their inverses (the time a bookie takes per
byte against each limit's).
"""
from __future__ import annotations

import os
import re
import time
from typing import Callable

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.local_cluster import Node
from bksim.formats.entry import HEADER_BYTES, encode_entry
from bksim.gen import bookie_pb2
from bksim.model.config import Config
from bksim.perf import bookie_add, fsync_baseline, grpc_baseline
from bksim.perf.grpc_baseline import drive
from bksim.perf.ledger_write import LedgerCluster
from bksim.perf.machine import sample_idle
from bksim.perf.procs import run_interruptible
from bksim.perf.scale import AxisReport, Column, Cost, dir_bytes, resolved, rss_bytes
from bksim.perf.stats import MB, make_result

LEDGER_POINTS = [10, 100, 1_000, 10_000, 100_000]
ENTRY_SIZE_POINTS = [100, 1024, 10 * 1024, 100 * 1024, 1024 * 1024]
ENTRY_PAYLOAD_BYTES = 100
LEDGER_BATCH = 100  # entries (of different ledgers) per AddRequest
LEDGER_INFLIGHT = 8  # AddRequests unanswered; also entry-size's in-flight batches
ENTRY_BATCH_BYTES = 1024 * 1024  # entry-size: entries per request = this / size, within 1..ENTRY_BATCH_MAX
ENTRY_BATCH_MAX = 100
RESTARTS = 3  # restarts per point; the fastest is kept
INDEX_RESOLVED_BYTES = 64 * 1024  # below this, the index's growth is RocksDB's files' fixed overhead
RSS_RESOLVED_BYTES = 2 * 1024 * 1024  # an RSS difference below this is the allocator's noise
RESTART_RESOLVED_S = 0.2  # a restart-time difference below this is jitter
_ROCKS_NOT_DATA = re.compile(r"^(LOG(\.old\..*)?|OPTIONS-.*)$")  # RocksDB's text logs and options files
SERVING_TIMEOUT_S = 120.0
RESPONSE_TIMEOUT_S = 60.0
DAY_MS = str(24 * 3600 * 1000)
CHILD_ENV = {"BKSIM_BOOKIE_GC_WAIT_TIME_MS": DAY_MS, "BKSIM_BOOKIE_MINOR_COMPACTION_INTERVAL_MS": DAY_MS,
             "BKSIM_BOOKIE_MAJOR_COMPACTION_INTERVAL_MS": DAY_MS, "BKSIM_AUTORECOVERY_ENABLED": "false"}


class LedgerEntries:
    """Entry 0 of a new ledger per take: ledger ids first_id, first_id + 1, ... (duck-types grpc_baseline's
    EntryFactory for `drive`)."""

    def __init__(self, first_id: int) -> None:
        self.next_id = first_id
        self._payload = bytes(range(256)) * (ENTRY_PAYLOAD_BYTES // 256) + bytes(ENTRY_PAYLOAD_BYTES % 256)

    def take(self, n: int) -> list[bytes]:
        out = [encode_entry(i, 0, -1, len(self._payload), self._payload) for i in range(self.next_id, self.next_id + n)]
        self.next_id += n
        return out


async def _wait_serving(bookie: Node) -> None:
    async with BookieClient(bookie.address, deadline_s=RESPONSE_TIMEOUT_S) as client:
        await bookie_add.wait_serving(client, bookie, SERVING_TIMEOUT_S, poll_s=0.02)


async def _add_ledgers(bookie: Node, entries: LedgerEntries, count: int):
    async with BookieClient(bookie.address, deadline_s=RESPONSE_TIMEOUT_S) as client:
        stream = client.add_stream(window_max=LEDGER_INFLIGHT, response_timeout_s=RESPONSE_TIMEOUT_S)
        result = await drive(stream, bookie_pb2.AddRequest, entries, LEDGER_BATCH, 0.0, count)
    if result.not_ok or result.latencies.records != count:
        raise RuntimeError(f"{result.not_ok} of {count} ledger entries not acknowledged OK: {result.first_error}; "
                           f"the bookie's log:\n{bookie.log_tail()}")
    return result


def _restart(cluster: LedgerCluster, bookie: Node) -> dict:
    """RSS, stop (timed), index bytes while stopped, start until SERVING (timed), RSS once serving; RESTARTS times,
    the fastest restart kept (a shared machine only ever adds time)."""
    best: dict | None = None
    for _ in range(RESTARTS):
        rss_before = rss_bytes(bookie.pid)
        t0 = time.monotonic()
        if not cluster.stop(bookie):
            raise RuntimeError(f"bookie (pid {bookie.pid}) did not stop; its log:\n{bookie.log_tail()}")
        stop_s = time.monotonic() - t0
        index = os.path.join(bookie.ledger_dir, "index")
        data = dir_bytes(index, lambda name: not _ROCKS_NOT_DATA.match(name))
        t1 = time.monotonic()
        cluster.spawn(bookie)
        run_interruptible(_wait_serving(bookie))
        start_s = time.monotonic() - t1
        r = {"rss_running": rss_before, "stop_s": stop_s, "index_bytes": data, "index_dir_bytes": dir_bytes(index),
             "entrylog_bytes": dir_bytes(os.path.join(bookie.ledger_dir, "entrylogs")), "start_s": start_s,
             "restart_s": stop_s + start_s, "rss_restarted": rss_bytes(bookie.pid)}
        if best is None or r["restart_s"] < best["restart_s"]:
            best = {**r, "rss_running": max(rss_before, best["rss_running"]) if best else rss_before}
    assert best is not None
    return best


def measure_ledgers(workdir: str, points: list[int], seconds: float, config: Config, *, config_path: str | None = None,
                    keep: bool = False, log: Callable[[str], None] = print, idle_before: float = 1.0) -> AxisReport:
    report = AxisReport(
        "ledgers", "ledgers",
        f"N ledgers on one bookie process (one {ENTRY_PAYLOAD_BYTES} B entry each, {LEDGER_BATCH} per AddRequest, "
        f"{LEDGER_INFLIGHT} in flight; GC and autorecovery off); restart = SIGTERM until gone + spawn until SERVING",
        [Column("points", "ledgers", ",d", 8), Column("idle", "idle", ".2f", 5),
         Column("adds_per_s", "ledgers/s", ",.0f", 9),
         Column("index_mb", "index MB", ".3f", 8), Column("index_b_per_ledger", "index B/ledger", ",.1f", 14),
         Column("rss_restarted_mb", "RSS MB", ".1f", 7), Column("rss_b_per_ledger", "RSS B/ledger", ",.0f", 12),
         Column("rss_running_mb", "RSS before", ".1f", 10),
         Column("stop_s", "stop s", ".2f", 6), Column("start_s", "start s", ".2f", 7),
         Column("restart_s", "restart s", ".2f", 9), Column("restart_us_per_ledger", "restart us/ledger", ",.2f", 17)],
        [Cost("index_b_per_ledger", "index bytes per ledger", "bytes"),
         Cost("rss_b_per_ledger", "RSS per ledger", "bytes"),
         Cost("restart_us_per_ledger", "restart time per ledger", "us")])
    with LedgerCluster(workdir, 1, config, config_path, keep, brokers=0, child_env=CHILD_ENV) as cluster:
        bookie = cluster.bookies[0]
        run_interruptible(_wait_serving(bookie))
        idle = sample_idle()
        base = _restart(cluster, bookie)
        report.rows.append({"points": 0, "baseline": True, "idle": idle, "index_mb": base["index_bytes"] / MB,
                            "rss_restarted_mb": base["rss_restarted"] / MB, "rss_running_mb": base["rss_running"] / MB,
                            "stop_s": base["stop_s"], "start_s": base["start_s"], "restart_s": base["restart_s"]})
        log(f"# scale ledgers: baseline index {base['index_bytes'] / MB:.2f} MB, RSS "
            f"{base['rss_restarted'] / MB:.1f} MB, restart {base['restart_s']:.2f} s")
        entries = LedgerEntries(1)
        have = 0
        for n in points:
            added = run_interruptible(_add_ledgers(bookie, entries, n - have))
            have = n
            idle = sample_idle()
            r = _restart(cluster, bookie)
            row = {"points": n, "idle": idle, "adds_per_s": added.latencies.records / added.elapsed_s,
                   "index_mb": r["index_bytes"] / MB, "index_dir_mb": r["index_dir_bytes"] / MB,
                   "rss_restarted_mb": r["rss_restarted"] / MB, "rss_running_mb": r["rss_running"] / MB,
                   "stop_s": r["stop_s"], "start_s": r["start_s"], "restart_s": r["restart_s"],
                   "entrylog_mb": r["entrylog_bytes"] / MB}
            index, rss, restart = (r["index_bytes"] - base["index_bytes"], r["rss_restarted"] - base["rss_restarted"],
                                   r["restart_s"] - base["restart_s"])
            resolved(row, "index_b_per_ledger", index / n, index >= INDEX_RESOLVED_BYTES)
            resolved(row, "rss_b_per_ledger", rss / n, rss >= RSS_RESOLVED_BYTES)
            resolved(row, "restart_us_per_ledger", restart * 1e6 / n, restart >= RESTART_RESOLVED_S)
            report.rows.append(row)
            log(f"# scale ledgers: {n:,} ledgers ({added.latencies.records:,} added at {row['adds_per_s']:,.0f}/s), "
                f"index {row['index_mb']:.2f} MB, RSS {row['rss_restarted_mb']:.1f} MB, restart {r['restart_s']:.2f} s")
            report.results.append(make_result(f"scale-ledgers-{n}", HEADER_BYTES + ENTRY_PAYLOAD_BYTES, LEDGER_BATCH,
                                              added.elapsed_s, added.latencies, idle,
                                              {"latency": "AddRequest of entry 0 of 100 new ledgers -> ack",
                                               **{k: v for k, v in row.items() if k not in ("points", "idle")}}))
    report.notes.append("per ledger = (value - the baseline's with no ledger) / ledgers; index = the RocksDB "
                        "data (SST, WAL, manifest) with the bookie stopped; restart: the fastest of "
                        f"{RESTARTS}; RSS once serving again after the restart")
    return report


def batch_for(size: int) -> int:
    return max(1, min(ENTRY_BATCH_MAX, ENTRY_BATCH_BYTES // size))


def measure_entry_sizes(workdir: str, points: list[int], seconds: float, config: Config, *,
                        config_path: str | None = None, keep: bool = False,
                        log: Callable[[str], None] = print, idle_before: float = 1.0) -> AxisReport:
    report = AxisReport(
        "entry-size", "bytes per entry",
        f"bookie-add vs the fsync and gRPC limits at each entry size (batch = {ENTRY_BATCH_BYTES // 1024} KiB / size, "
        f"1..{ENTRY_BATCH_MAX} entries; {LEDGER_INFLIGHT} batches in flight; fsync group = batch x "
        f"{LEDGER_INFLIGHT}); {seconds:g} s each",
        [Column("points", "entry B", ",d", 9), Column("batch", "batch", "d", 5), Column("idle", "idle", ".2f", 5),
         Column("fsync_mb_s", "fsync MB/s", ",.1f", 10), Column("grpc_mb_s", "gRPC MB/s", ",.1f", 9),
         Column("bookie_mb_s", "bookie MB/s", ",.1f", 11), Column("bookie_per_s", "entries/s", ",.0f", 9),
         Column("vs_fsync", "bookie/fsync", ".3f", 12), Column("vs_grpc", "bookie/gRPC", ".3f", 11),
         Column("fsync_over_bookie", "fsync/bookie", ".2f", 12), Column("grpc_over_bookie", "gRPC/bookie", ".2f", 11),
         Column("bookie_cpu_us_per_kb", "bookie us/KB", ",.2f", 12)],
        [Cost("fsync_over_bookie", "time per byte vs the fsync limit", "x the limit's"),
         Cost("grpc_over_bookie", "time per byte vs the gRPC limit", "x the limit's")])

    def sampled(label: str) -> float:  # the axis waited for idle CPUs once; each measurement samples only
        fraction = sample_idle()
        log(f"# cpu idle before {label}: {fraction:.2f} (sampled)")
        return fraction

    for size in points:
        largest = min(config.bookie.entry_bytes_max, config.bookie.frame_bytes_max - 64 * 1024)
        if not HEADER_BYTES <= size <= largest:
            raise ValueError(f"entry size {size} B is outside {HEADER_BYTES}..{largest}")
        batch = batch_for(size)
        fs = fsync_baseline.run(workdir, size, batch * LEDGER_INFLIGHT, seconds, 0, sampled(f"fsync-baseline {size} B"))
        gb = grpc_baseline.measure(workdir, size, batch, LEDGER_INFLIGHT, seconds, 0, sampled)
        ba = bookie_add.measure(workdir, size, batch, LEDGER_INFLIGHT, seconds, 0, sampled, config,
                                config_path=config_path, keep=keep)
        if ba.extra.get("records_not_ok"):
            raise RuntimeError(f"bookie-add at {size} B: {ba.extra['records_not_ok']} entries not OK: "
                               f"{ba.extra.get('first_error')}")
        row = {"points": size, "batch": batch, "idle": ba.cpu_idle_before, "fsync_mb_s": fs.mb_per_s,
               "grpc_mb_s": gb.mb_per_s, "bookie_mb_s": ba.mb_per_s, "bookie_per_s": ba.records_per_s,
               "vs_fsync": ba.mb_per_s / fs.mb_per_s if fs.mb_per_s else None,
               "vs_grpc": ba.mb_per_s / gb.mb_per_s if gb.mb_per_s else None,
               "fsync_over_bookie": fs.mb_per_s / ba.mb_per_s if ba.mb_per_s else None,
               "grpc_over_bookie": gb.mb_per_s / ba.mb_per_s if ba.mb_per_s else None,
               "bookie_cpu_us_per_kb": (ba.extra["server_cpu_cores"] * 1e6 / (ba.mb_per_s * 1000)
                                        if ba.mb_per_s else None),
               "bookie_p99_ms": ba.p99_ms, "grpc_p99_ms": gb.p99_ms, "fsync_p99_ms": fs.p99_ms}
        report.rows.append(row)
        log(f"# scale entry-size: {size:,} B x {batch}: fsync {fs.mb_per_s:,.1f} MB/s, gRPC {gb.mb_per_s:,.1f} MB/s, "
            f"bookie-add {ba.mb_per_s:,.1f} MB/s")
        report.results += [fs, gb, ba]
    report.notes.append("bookie/fsync and bookie/gRPC: bookie-add's MB/s over each limit's at the same size; "
                        "judged: their inverses (how many times a limit's time per byte the bookie takes)")
    return report
