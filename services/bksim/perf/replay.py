"""replay: the bookie's journal replay on start-up (BookieEngine.start) against a bare parse of the same journal files.

One BookieEngine (bookie/engine.py) in-process on real files and a real RocksDB (LocalDisk, open_rocks, the system
clock), under a fresh directory in the benchmark's temp dir (same disk as the bookies' data). No gRPC: a restart
replays before the server takes requests.

1. Fill: `size` bytes of `entry_bytes`-byte entries (36-byte header + payload, each entry's payload a different
   slice of one random pool), round robin over LEDGERS ledgers in add batches of up to FILL_BATCH entries of one
   ledger, FILL_CONCURRENCY batches at a time, every batch awaited until journal-synced (`engine.add_entries`).
   The fill engine takes the configuration's bookie options except two, so that no checkpoint moves the journal
   mark: `flush_interval_ms` (the periodic checkpoint) a day, and `write_cache_bytes_max` twice the fill plus one
   batch (a full write-cache half also triggers a checkpoint). Checked before going on: the engine made exactly
   one checkpoint (its own, on start, before any record) and the mark persisted on disk (bookie/lastmark.py)
   still lies before the first journal record, so a replay has every record written to apply.
2. Crash: `engine.abandon()`, the engine's crash simulation (the tests' too): the journal writer is cancelled and
   its file closed, the checkpoint task cancelled, the entry logger and the RocksDB stores closed, nothing
   checkpointed. Every add was acknowledged, so every record is synced in the journal.
3. journal-parse (the denominator): every journal file of the directory read whole and parsed the way replay
   (bookie/replay.py) and `bksim journal dump` do at the lowest level (formats/journal.py): decode_file_header and
   the instance check, scan_journal (every group's and every record's CRC, each body copied out of the file), and
   check_body on every record; each file's bytes and records are freed before the clock stops (replay frees its
   own within its call). No engine, no index, no cache.
4. journal-replay: a second BookieEngine, with the configuration's bookie options (as a restarted bookie has: the
   write cache fills at every `write_cache_bytes_max / 2` bytes replayed and replay checkpoints there), on the same
   directories; `await engine.start()` timed whole: opening RocksDB and the entry logs, replay, the checkpoint of
   what replay left in the write cache, opening the journal. records = `replay_report.records`.
   replay-only: the same records over the `replay(...)` call alone: its span is timed by wrapping, for the
   duration of start(), the reference bookie/engine.py calls (`bksim.bookie.engine.replay`); the wrapper changes
   nothing it does. The split is reported with the journal-replay row: before replay (open), replay (replay's own
   checkpoints run in tasks meanwhile), after (the wait for the last of them, the final checkpoint, the journal
   opened), and the checkpoints start() made (engine stats).
   The process's resident set (VmRSS of /proc/self/status) before and after start(), and its peak during start()
   (VmHWM after resetting it through /proc/self/clear_refs, when the kernel allows), are reported too.
   Verified afterwards, else the run fails: `replay_report.records` equals the records the fill's journal synced
   and the records journal-parse found; nothing was torn or skipped; and the first, middle and last entries of
   every ledger read back through the engine byte for byte.
Ratios journal-replay / journal-parse and replay-only / journal-parse (records/s): target >= 0.5x.

Reported with the results (the machine is shared): the 1-minute load average as each measurement started and the
process's CPU seconds (all its threads) during it. The fill's memory is not all handed back to the system, so
rss_before_mb includes some of it, more in a repeated run.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import shutil
import time
import uuid
from typing import Callable

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import index_opener
from bksim.bookie import engine as engine_module
from bksim.bookie.engine import BookieEngine
from bksim.bookie.journal import JournalMark, list_journal_ids
from bksim.bookie.lastmark import read_lastmark
from bksim.formats import journal as jfmt
from bksim.formats.entry import HEADER_BYTES, encode_entry
from bksim.model.config import BookieConfig, Config
from bksim.model.status import StatusCode
from bksim.perf.machine import idle_noting_load, process_memory_bytes
from bksim.perf.procs import run_interruptible
from bksim.perf.stats import MB, LatencyRecorder, Ratio, Result, make_result, ratio

TARGET_RATIO = 0.5  # replay records/s over the bare parse's records/s
LEDGERS = 16
FILL_BATCH = 256  # entries per add_entries call of the fill (one journal sync)
FILL_CONCURRENCY = 4
POOL_SLACK = 4096  # payloads are slices of a random pool this much longer than one payload
NO_CHECKPOINT_MS = 86_400_000  # the fill engine's checkpoint period: never within a run
MASTER_KEY = b"perf-replay-key!"


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    size_bytes: int  # entry bytes to write (headers included)
    entry_bytes: int  # bytes per entry, header included

    def __post_init__(self) -> None:
        if self.entry_bytes < HEADER_BYTES + 1:
            raise ValueError(f"need entry bytes > {HEADER_BYTES}, got {self.entry_bytes}")
        if self.entries < self.entries_min:
            raise ValueError(f"size {self.size_bytes} B holds {self.entries} entries of {self.entry_bytes} B: "
                             f"need at least {self.entries_min} (batches of {FILL_BATCH} round robin: an entry in "
                             f"each of the {LEDGERS} ledgers)")

    @property
    def entries_min(self) -> int:
        """The fewest entries that give every ledger one: the fill's batches go round robin over the ledgers."""
        return (LEDGERS - 1) * FILL_BATCH + 1

    @property
    def entries(self) -> int:
        return self.size_bytes // self.entry_bytes


def measure(workdir: str, shape: Shape, idle: Callable[[str], float], config: Config,
            log: Callable[[str], None] = print) -> tuple[list[Result], list[Ratio]]:
    """Fill, crash, parse, replay (module docstring); returns the figures."""
    return run_interruptible(_measure(workdir, shape, idle, config, log))


async def _measure(workdir: str, shape: Shape, idle: Callable[[str], float], config: Config,
                   log: Callable[[str], None]) -> tuple[list[Result], list[Ratio]]:
    root = os.path.join(workdir, f"engine-{uuid.uuid4().hex[:8]}")
    dirs = _Dirs(os.path.join(root, "journal"), os.path.join(root, "ledgers"), str(uuid.uuid4()))
    try:
        started = time.monotonic()
        data = _Data(shape)
        written = await _fill(dirs, data, config.bookie)
        log(f"# fill: {shape.entries:,} entries of {shape.entry_bytes} B in {LEDGERS} ledgers, {written:,} journal "
            f"records, {_journal_bytes(dirs) / MB:.1f} MB of journal in {time.monotonic() - started:.1f} s; "
            f"crashed without a checkpoint")
        gc.collect()  # the fill engine's write cache goes before the RSS is read
        loads: dict[str, float] = {}
        ready = idle_noting_load(idle, loads)

        parse = _parse(dirs, shape, written, ready("journal-parse"))
        replayed, replay_only = await _replay(dirs, data, config.bookie, written, ready("journal-replay"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    parse.extra["load_avg_1m"] = loads["journal-parse"]
    replayed.extra["load_avg_1m"] = loads["journal-replay"]
    return [parse, replayed, replay_only], [ratio(replayed, parse, TARGET_RATIO),
                                            ratio(replay_only, parse, TARGET_RATIO)]


@dataclasses.dataclass(frozen=True, slots=True)
class _Dirs:
    journal: str
    ledgers: str
    instance_id: str

    def engine(self, config: BookieConfig, log: Callable[[str], None], disk: LocalDisk) -> BookieEngine:
        return BookieEngine(config, disk=disk, clock=SystemClock(), open_kv=index_opener(config.index_write_buffer_bytes),
                            instance_id=self.instance_id,
                            journal_dir=self.journal, ledger_dir=self.ledgers, log=log)


class _Data:
    """The entries of the fill: ledger ids 1..LEDGERS, entry ids from 0, each entry recomputable for the read-back."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.payload_bytes = shape.entry_bytes - HEADER_BYTES
        self._pool = os.urandom(self.payload_bytes + POOL_SLACK)
        self.counts = [0] * (LEDGERS + 1)  # entries per ledger id (index 0 unused)

    def entry(self, ledger_id: int, entry_id: int) -> bytes:
        start = (ledger_id * 7919 + entry_id * 131) % POOL_SLACK
        payload = self._pool[start:start + self.payload_bytes]
        return encode_entry(ledger_id, entry_id, entry_id - 1, (entry_id + 1) * self.payload_bytes, payload)

    def batches(self):
        """(ledger id, [entries]) round robin over the ledgers until `shape.entries` entries are made."""
        left = self.shape.entries
        turn = 0
        while left > 0:
            ledger_id = 1 + turn % LEDGERS
            turn += 1
            n = min(FILL_BATCH, left)
            first = self.counts[ledger_id]
            self.counts[ledger_id] += n
            left -= n
            yield ledger_id, [self.entry(ledger_id, eid) for eid in range(first, first + n)]


async def _fill(dirs: _Dirs, data: _Data, config: BookieConfig) -> int:
    """Write every entry, check that no checkpoint moved the mark, abandon the engine; the journal records synced."""
    fill_config = dataclasses.replace(config, flush_interval_ms=NO_CHECKPOINT_MS, write_cache_bytes_max=2 * (
        data.shape.entries + FILL_BATCH) * data.shape.entry_bytes)
    logs: list[str] = []
    engine = dirs.engine(fill_config, logs.append, LocalDisk())
    await engine.start()
    try:
        checkpoints = engine.stats["checkpoints"]
        batches = data.batches()
        while chunk := [b for _, b in zip(range(FILL_CONCURRENCY), batches)]:
            await asyncio.gather(*(_add(engine, ledger_id, entries) for ledger_id, entries in chunk))
        stats = engine.statistics()
        if stats["checkpoints"] != checkpoints or stats["journal"]["queued_records"]:
            raise RuntimeError(f"fill: {stats['checkpoints'] - checkpoints} checkpoint(s) ran during the fill, "
                               f"{stats['journal']['queued_records']} record(s) unsynced")
        written = stats["journal"]["records"]
    finally:
        engine.abandon()
    await asyncio.sleep(0)  # the cancelled writer and checkpoint tasks end
    _check_mark(dirs)
    _check_logs("fill", logs)
    return written


async def _add(engine: BookieEngine, ledger_id: int, entries: list[bytes]) -> None:
    statuses, why = await engine.add_entries([(entry, MASTER_KEY, 0) for entry in entries])
    if any(s is not StatusCode.OK for s in statuses):
        raise RuntimeError(f"fill: add to ledger {ledger_id} failed: {why}")


def _check_mark(dirs: _Dirs) -> None:
    """The persisted mark must lie before the first journal record: replay then applies every record written."""
    disk = LocalDisk()
    mark = read_lastmark(disk, dirs.ledgers)
    ids = list_journal_ids(disk, dirs.journal)
    if not ids or mark > JournalMark(ids[0], jfmt.FILE_HEADER_BYTES):
        raise RuntimeError(f"fill: the persisted mark {mark} is past the start of journal(s) {ids}: replay would "
                           f"not see every record")


def _journal_paths(dirs: _Dirs) -> list[str]:
    return [os.path.join(dirs.journal, jfmt.journal_file_name(i)) for i in list_journal_ids(LocalDisk(), dirs.journal)]


def _journal_bytes(dirs: _Dirs) -> int:
    return sum(os.path.getsize(p) for p in _journal_paths(dirs))


def _parse(dirs: _Dirs, shape: Shape, written: int, cpu_idle: float) -> Result:
    """journal-parse: read and parse every journal file as replay does, with nothing applied."""
    paths = _journal_paths(dirs)
    records = body_bytes = file_bytes = 0
    cpu_started, started = time.process_time(), time.perf_counter()
    for position, path in enumerate(paths):
        with open(path, "rb") as f:
            data = f.read()
        file_bytes += len(data)
        if not jfmt.same_instance(jfmt.decode_file_header(data), dirs.instance_id):
            raise RuntimeError(f"{path} belongs to another cluster instance")
        result = jfmt.scan_journal(data, jfmt.FILE_HEADER_BYTES, position == len(paths) - 1, name=path)
        check_body = jfmt.check_body
        for record in result.records:
            check_body(record)
            body_bytes += len(record.body)
        records += len(result.records)
        del data, result  # freed within the span, as replay's are when its call returns
    elapsed, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    if records != written:
        raise RuntimeError(f"journal-parse found {records} records, the fill's journal synced {written}")
    latencies = LatencyRecorder()
    latencies.add(elapsed, records)
    return make_result("journal-parse", shape.entry_bytes, 1, elapsed, latencies, cpu_idle,
                       {"journals": len(paths), "journal_bytes": file_bytes, "body_bytes": body_bytes,
                        "journal_mb_per_s": file_bytes / elapsed / MB, "cpu_s": cpu_s})


class _Spans:
    """Times the replay() call engine.start() makes, from outside: its module's reference, wrapped for the duration
    (the wrapper changes nothing it does)."""

    def __init__(self) -> None:
        self.replay: tuple[float, float] | None = None

    @contextlib.contextmanager
    def around(self):
        original_replay = engine_module.replay

        async def timed_replay(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await original_replay(*args, **kwargs)
            finally:
                self.replay = (started, time.perf_counter())

        engine_module.replay = timed_replay
        try:
            yield self
        finally:
            engine_module.replay = original_replay

    def split(self, started: float, ended: float) -> dict:
        """Seconds of start(): before replay (opening storage), replay (its checkpoints run in tasks meanwhile),
        and after it (the wait for replay's last checkpoint, the final checkpoint, opening the journal)."""
        r0, r1 = self.replay
        return {"open_s": r0 - started, "replay_s": r1 - r0, "after_s": ended - r1}


async def _replay(dirs: _Dirs, data: _Data, config: BookieConfig, written: int, cpu_idle: float
                  ) -> tuple[Result, Result]:
    """journal-replay and replay-only: a fresh engine's start() on the crashed directories, then the checks."""
    logs: list[str] = []
    engine = dirs.engine(config, logs.append, LocalDisk())
    spans = _Spans()
    rss_before = _rss_mb("rss")
    peak_reset = _reset_peak_rss()
    checkpoints_before = engine.stats["checkpoints"]
    with spans.around():
        cpu_started, started = time.process_time(), time.perf_counter()
        try:
            await engine.start()
        except BaseException:
            engine.abandon()
            raise
        ended, cpu_s = time.perf_counter(), time.process_time() - cpu_started
    rss_after = _rss_mb("rss")
    peak = _rss_mb("peak") if peak_reset else None
    try:
        report = engine.replay_report
        if report.records != written or report.torn or report.skipped:
            raise RuntimeError(f"replay applied {report.records} of {written} records written (torn {report.torn}, "
                               f"skipped {report.skipped})")
        await _read_back(engine, data)
    finally:
        await engine.close()
    _check_logs("replay", logs)
    split = spans.split(started, ended)
    extra = {"journals": len(report.journals), "cpu_s": cpu_s, **split,
             "checkpoints": engine.stats["checkpoints"] - checkpoints_before, "rss_before_mb": rss_before,
             "rss_after_mb": rss_after,
             "rss_peak_mb": peak, "write_cache_mb": config.write_cache_bytes_max / MB}
    whole = _result("journal-replay", data.shape, report.records, ended - started, cpu_idle, extra)
    alone = _result("replay-only", data.shape, report.records, split["replay_s"], cpu_idle, {})
    return whole, alone


def _result(name: str, shape: Shape, records: int, elapsed: float, cpu_idle: float, extra: dict) -> Result:
    latencies = LatencyRecorder()
    latencies.add(elapsed, records)
    return make_result(name, shape.entry_bytes, 1, elapsed, latencies, cpu_idle, extra)


async def _read_back(engine: BookieEngine, data: _Data) -> None:
    """The first, middle and last entry of every ledger, through the engine, byte for byte."""
    for ledger_id in range(1, LEDGERS + 1):
        count = data.counts[ledger_id]
        for entry_id in sorted({0, count // 2, count - 1}):
            status, entry, _lac, why = await engine.read_entry(ledger_id, entry_id)
            if status is not StatusCode.OK or entry != data.entry(ledger_id, entry_id):
                raise RuntimeError(f"read-back of entry {ledger_id}:{entry_id} after replay: {status.name} {why}"
                                   + ("" if status is not StatusCode.OK else " (bytes differ)"))


def _check_logs(phase: str, logs: list[str]) -> None:
    bad = [line for line in logs if "internal error" in line or "failed" in line or "CORRUPTION" in line]
    if bad:
        raise RuntimeError(f"{phase}: the engine logged failures: {bad[:3]}")


def _rss_mb(which: str) -> float:
    """This process's resident set ("rss") or its peak ("peak") in MB (10^6 bytes)."""
    return process_memory_bytes(os.getpid())[which] / MB


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (/proc/self/clear_refs, value 5); False when the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
