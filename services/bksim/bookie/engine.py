"""The bookie's storage engine (PROTOCOL.md §2): validation, write path, read path, fencing, LAC,
checkpoints, replay, read-only mode. Knows nothing of gRPC or ZooKeeper; time and I/O come through ports.

Ordering contracts:
- An add is acknowledged (its status OK returned) only after the journal sync covering its record.
- A fence is answered only after its FENCE journal record is synced.
- Checkpoint order (PROTOCOL.md §2.2): mark M -> swap caches -> append to entry log -> fsync entry log ->
  index batch (synced) -> ledger index (synced) -> persist M. The persisted mark never moves backwards.
  Replay checkpoints a full write-cache half in a task while it fills the other (section "replay"); M is then
  the start of the group of the first record left out of that half.
- "Unknown is never no": NO_LEDGER / NO_ENTRY only when the bookie durably knows; a damaged or missing
  entry-log record behind an index entry is IO_ERROR; what a re-initialised bookie lacks of a ledger in limbo
  (id <= `limbo_ledger_id_max`, from the cookie `bksim bookie format` wrote: bookie/cookie.py) is UNKNOWN_STATE,
  for reads, fencing reads, ReadLac and ListEntries alike, because an earlier incarnation may have held it.
- Garbage collection (driven by bookie/gc.py, which owns the policy and the metadata port): a ledger is
  deleted only by `delete_ledgers(ids, generation)`, and only if nothing touched it (add, fence, key, explicit
  LAC, replay) after `generation` was read, which the caller does before its metadata read starts. Deleting:
  checkpoint first (the ledger's cached entries reach the index, its journal records fall below the mark),
  then its location records in one synced batch (fault step gc_index_delete), then its ledger record
  (gc_ledger_delete); caches and LACs are dropped at once. A crash between the two leaves the ledger record,
  and the next round finishes. What a deleted ledger answers afterwards is NO_LEDGER: the bookie durably knows
  it holds nothing of it (the metadata said it is gone). A journal record of it above the mark (an add that
  raced the round) brings it back at replay; the next round deletes it again.
- Entry logs: `delete_dead_logs` removes sealed logs none of whose ledgers is present (file first,
  gc_log_delete; then its metadata record, gc_meta_delete); `compact_log` follows bookie/compaction.py.
  Neither touches the log being written. Entry-log metadata (bookie/index.py LogMetaIndex) covers every
  sealed log; the current log's map is in memory.
"""
from __future__ import annotations

import asyncio
import heapq
import hmac
import os
from itertools import chain, islice, repeat
from operator import add, itemgetter, lt
from typing import Callable, Sequence

from bksim.bookie import compaction
from bksim.bookie.caches import ReadCache, WriteCache
from bksim.bookie.compaction import COMPACTION_STEPS, CompactionWriter
from bksim.bookie.entry_log import EntryLogger
from bksim.bookie.index import LedgerIndex, LocationIndex, LogMetaIndex
from bksim.bookie.journal import Journal, JournalMark, list_journal_ids
from bksim.bookie.lastmark import LASTMARK_FILE, encode_lastmark, read_lastmark
from bksim.bookie.replay import ReplayReport, replay
from bksim.bookie.requests import list_ranges_max
from bksim.formats import entry as entry_fmt
from bksim.formats import index as index_fmt
from bksim.formats import journal as jfmt
from bksim.formats.crc import crc32c
from bksim.model.config import BookieConfig
from bksim.model.errors import BksimError, BookieError, FormatError
from bksim.model.histogram import LatencyHistogram
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode
from bksim.ports.clock import Clock
from bksim.ports.disk import Disk
from bksim.ports.kv import KeyValueStore

OK = StatusCode.OK
_IDS = entry_fmt.IDS
_HEADER_BYTES = entry_fmt.HEADER_BYTES
_pack_prefix = jfmt.RECORD_PREFIX.pack
_LENGTH_MIN = jfmt.LENGTH_MIN
_ENTRY = int(jfmt.RecordType.ENTRY)
# CRC of (type, flags) for ENTRY records, by RECOVERY_ADD flag: the record CRC continues from it over the body
_ENTRY_CRC_SEED = (crc32c(bytes((jfmt.RecordType.ENTRY, 0))), crc32c(bytes((jfmt.RecordType.ENTRY, 1))))
CHECKPOINT_STEPS = ("mark", "swap", "entrylog_write", "entrylog_sync", "index_write", "ledger_index_write",
                    "lastmark_write")
_ENTRY_RECORD = jfmt.RecordType.ENTRY
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
# replay checkpoints the active write-cache half early, between two lists of records, once it holds this fraction of
# a half and no replay checkpoint runs: checkpoints then follow each other, and what is left to checkpoint when
# replay ends (before the bookie serves) is about what replay applied during the last one, not up to a half
REPLAY_EARLY_SWAP_FRACTION = 4
GC_STEPS = ("gc_index_delete", "gc_ledger_delete", "gc_log_delete", "gc_meta_delete")
GC_AND_COMPACTION_STEPS = GC_STEPS + COMPACTION_STEPS


class BookieEngine:
    def __init__(self, config: BookieConfig, *, disk: Disk, clock: Clock,
                 open_kv: Callable[[str], KeyValueStore], instance_id: str, journal_dir: str, ledger_dir: str,
                 log: Callable[[str], None] = print,
                 fault_hook: Callable[[str], None] | None = None, limbo_ledger_id_max: int = -1,
                 first_checkpoint_ms: float | None = None, first_half_fraction: float | None = None) -> None:
        self.config = config
        # when the first checkpoints come, so that bookies started together do not checkpoint together: the
        # periodic one's first run after start (None: one flush interval; later ones every interval) and the
        # share of a write-cache half the first half may fill before an add asks for one (None: all of it)
        self._first_checkpoint_ms = config.flush_interval_ms if first_checkpoint_ms is None else first_checkpoint_ms
        self.limbo_ledger_id_max = limbo_ledger_id_max  # ledgers that may predate a format: never denied
        self._disk, self._clock, self._open_kv, self._log = disk, clock, open_kv, log
        self.instance_id = instance_id
        self.journal_dir, self.ledger_dir = journal_dir, ledger_dir
        self._fault_hook = fault_hook or (lambda step: None)
        self._write_cache = WriteCache(config.write_cache_bytes_max, config.write_cache_entry_overhead_bytes)
        self._first_half_fraction = first_half_fraction
        self._read_cache = ReadCache(config.read_cache_bytes_max)
        self._entry_bytes_max = min(config.entry_bytes_max,
                                    self._write_cache.half_bytes_max - config.write_cache_entry_overhead_bytes)
        self._entry_logger = EntryLogger(disk, os.path.join(ledger_dir, "entrylogs"), config.entry_log_bytes_max,
                                         page_cache_bytes=config.entry_log_page_cache_bytes)
        self._journal = Journal(disk, clock, journal_dir, instance_id, group_wait_ms_max=config.group_wait_ms_max,
                                group_bytes_max=config.group_bytes_max, flush_when_idle=config.journal_flush_when_idle,
                                file_bytes_max=config.journal_file_bytes_max,
                                queue_records_max=config.journal_queue_records_max,
                                sync_on_loop=config.journal_sync_on_loop, log=log,
                                on_failure=self._journal_failed,
                                remove_from_page_cache=config.journal_remove_from_page_cache)
        self._locations: LocationIndex | None = None
        self._ledgers: LedgerIndex | None = None
        self._log_meta: LogMetaIndex | None = None
        # garbage collection: a counter bumped by every touch of a ledger, and the value at its last touch
        self._generation = 0
        self._seen: dict[int, int] = {}
        self._lac: dict[int, int] = {}  # highest piggybacked LAC seen per ledger since start (adds, replay)
        self._base_lac: dict[int, int] = {}  # LAC inside the last entry-log entry of a ledger, read once
        self._persisted_mark = JournalMark(0, 0)
        self._checkpoint_lock = asyncio.Lock()
        self._checkpoint_queued = False  # a checkpoint asked for by a waiting add is waiting for the lock
        self.flush_latency = LatencyHistogram()  # each checkpoint, lock held to journals collected
        self._cache_room = asyncio.Event()  # set when a checkpoint swaps or frees a write-cache half
        self._tasks: list[asyncio.Task] = []  # the periodic checkpoint loop, checkpoints requested by adds, replay's
        self._replay_flush: asyncio.Task | None = None  # replay's checkpoint of a full write-cache half, running
        self._checkpoint_timer: asyncio.Task | None = None
        self._read_only = False
        self._free_bytes = 1 << 62
        self._total_bytes = 1 << 62
        self._closing = False
        self.replay_report: ReplayReport | None = None
        self.stats = {"adds": 0, "reads": 0, "fences": 0, "checkpoints": 0, "throttled": 0, "lists": 0,
                      "gc_ledgers_deleted": 0, "gc_logs_deleted": 0, "compacted_logs": 0}
        # fences journaled but not yet known durable: ledger -> the task that journals and waits for the sync
        # (later fencing reads share it); a ledger fenced in the index and absent here is durably fenced
        self._fence_syncs: dict[int, asyncio.Task] = {}
        self._fence_unconfirmed: set[int] = set()  # fenced in memory, but its journal write failed

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open storage, replay the journal from the checkpoint mark, checkpoint, then accept requests."""
        for d in (self.journal_dir, self.ledger_dir, os.path.join(self.ledger_dir, "index")):
            self._disk.makedirs(d)
        self._locations = LocationIndex(self._open_kv(os.path.join(self.ledger_dir, "index", "locations")))
        self._ledgers = LedgerIndex(self._open_kv(os.path.join(self.ledger_dir, "index", "ledgers")))
        self._log_meta = LogMetaIndex(self._open_kv(os.path.join(self.ledger_dir, "index", "entrylogs")))
        self._persisted_mark = read_lastmark(self._disk, self.ledger_dir)
        self._disk.makedirs(self._entry_logger.directory)
        await compaction.recover(self._disk, self._entry_logger, self._locations, self._log)
        # a crash between deleting a log and dropping its metadata record (gc_log_delete, compact_delete) leaves the
        # record; the log opened next may take that id (ids are above every log on disk): drop such records first
        on_disk = set(self._entry_logger.log_ids())
        stale = [log_id for log_id in self._log_meta.log_ids() if log_id not in on_disk]
        if stale:
            await self._log_meta.write({}, stale)
        await self._entry_logger.open()
        try:
            self.replay_report = await replay(self._disk, self.journal_dir, self._persisted_mark, self.instance_id,
                                              None, self.config.journal_skip_corruption, self._log,
                                              apply_batch=self._apply_records)
            await self._replay_flushed()
        except Exception:
            await self._replay_flush_settled()
            raise
        except BaseException:  # cancelled (a crash, a stop): so is replay's checkpoint
            self._replay_flush_cancelled()
            raise
        self._adopt_unrecorded_ledgers()
        await self.checkpoint(mark=self.replay_report.end)
        await self._journal.open(after_id=self.replay_report.end.journal_id)
        self._journal.start()
        if self._first_half_fraction is not None:
            self._write_cache.shorten_active(int(self._write_cache.half_bytes_max * self._first_half_fraction))
        self._checkpoint_timer = asyncio.get_running_loop().create_task(self._checkpoint_loop(), name="checkpoint")
        self._tasks.append(self._checkpoint_timer)
        r = self.replay_report
        self._log(f"storage ready: replayed {r.records} journal records from {len(r.journals)} journal(s), "
                  f"{len(self._ledgers)} ledgers, torn tails: {len(r.torn)}, writing journal "
                  f"{jfmt.journal_file_name(self._journal.current_id)}")

    async def close(self) -> None:
        """Drain the journal, checkpoint everything, close files and stores."""
        if self._closing:
            return
        self._closing = True
        await self._journal.stop()
        if self._checkpoint_timer is not None:  # the periodic loop only: a running checkpoint (shielded) finishes
            self._checkpoint_timer.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # checkpoints already started run to the end
        self._tasks.clear()
        if self._journal.failed is None:
            await self.checkpoint()
            log_id, ledger_bytes = await self._entry_logger.seal_current()
            await self._log_meta.write({log_id: ledger_bytes}, [])
        self._close_storage()

    def abandon(self) -> None:
        """Crash simulation (tests): drop everything in memory without a checkpoint."""
        self._closing = True
        self._journal.abandon()
        for task in self._tasks:
            task.cancel()
        self._close_storage()

    def _adopt_unrecorded_ledgers(self) -> None:
        """A crash between checkpoint steps 5 (locations, synced) and 6 (ledger index) leaves locations of a ledger
        whose record never became durable (nothing of it acknowledged: its journal records were lost too). Garbage
        collection and compaction know ledgers by their records: without one the ledger is never compared with
        the metadata, and compaction takes its records for a deleted ledger's and deletes the log they are in.
        Start-up gives each such ledger a record (flushed by the start checkpoint)."""
        for ledger_id in self._locations.ledger_ids():
            if ledger_id not in self._ledgers:
                self._ledgers.update(ledger_id)

    def _close_storage(self) -> None:
        self._entry_logger.close()
        for index in (self._locations, self._ledgers, self._log_meta):
            if index is not None:
                index.close()
        self._locations = self._ledgers = self._log_meta = None

    # -- state -------------------------------------------------------------------------------------------
    @property
    def read_only(self) -> bool:
        """Read-only because the disk is full (until it drains) or because the journal failed (until restart)."""
        return self._read_only or self._journal.failed is not None

    def _journal_failed(self, why: str) -> None:
        """A journal write or sync failed: nothing more can be made durable, so the bookie turns read-only for
        good (the server re-registers it under available/readonly): adds and fences get IO_ERROR, reads of what
        it acknowledged are still served. Restarting it replays the journal (its last group may be torn)."""
        self._log(f"bookie is now read-only until restarted (journal failed: {why}): adds and fences get IO_ERROR, "
                  f"reads are served")

    def set_disk_usage(self, total_bytes: int, free_bytes: int) -> bool:
        """Apply the disk thresholds with hysteresis; return True when the read-only state flipped."""
        self._total_bytes, self._free_bytes = total_bytes, free_bytes
        used = 1.0 - free_bytes / total_bytes if total_bytes else 1.0
        before = self._read_only
        if not self._read_only and used >= self.config.disk_usage_threshold:
            self._read_only = True
        elif self._read_only and used < self.config.disk_usage_lwm_threshold:
            self._read_only = False
        if before != self._read_only:
            state = "read-only" if self._read_only else \
                "writable" if self._journal.failed is None else "still read-only (its journal failed)"
            self._log(f"disk {used:.1%} used: bookie is now {state}")
        return before != self._read_only

    def info(self) -> dict:
        return {"state": "read-only" if self.read_only else "writable", "free_bytes": self._free_bytes,
                "total_bytes": self._total_bytes, "instance_id": self.instance_id}

    def latencies(self) -> dict:
        """The LatencyHistograms by name ("journal_sync", "journal_add", "flush": checkpoints): exported as metrics."""
        return {"journal_sync": self._journal.sync_latency, "journal_add": self._journal.add_latency,
                "flush": self.flush_latency}

    def statistics(self) -> dict:
        return dict(self.stats, journal=self._journal.statistics(), write_cache_bytes=self._write_cache.active_bytes,
                    flushing_bytes=self._write_cache.flushing_bytes, persisted_mark=tuple(
                        (self._persisted_mark.journal_id, self._persisted_mark.offset)),
                    ledgers=len(self._ledgers) if self._ledgers else 0, read_only=self.read_only)

    # -- write path --------------------------------------------------------------------------------------
    async def add_entries(self, items: Sequence[tuple[bytes, bytes, int]]) -> tuple[list[StatusCode], str]:
        """Add a batch of (entry, master key, flags). Returns (statuses, first error message).

        Returns only when every OK entry is durable in the journal. Never raises for bad input.
        """
        return await self.start_adds(items).result()

    def start_adds(self, items: Sequence[tuple[bytes, bytes, int]]) -> "AddBatch":
        """Begin an add batch without a task: validation, write-cache insertion and journal queueing happen
        now (PROTOCOL.md §2.2 steps 1-3); `await batch.result()` returns once the OK entries are durable.

        Only when the write cache is full does the rest of the batch continue in a task (throttling).
        """
        batch = AddBatch(len(items))
        if (items and len(set(map(_SECOND, items))) == 1 and len(set(map(_THIRD, items))) == 1
                and self._started_as_run(list(map(_FIRST, items)), items[0][1], items[0][2], batch)):
            return batch
        return self._start_adds(items, batch)

    def start_adds_compact(self, entries: Sequence[bytes], master_key: bytes, flags: int) -> "AddBatch":
        """start_adds of (entry, master_key, flags) for each of `entries` (a compact AddRequest), with the same
        outcome. The usual batch, entries of one ledger with ascending ids that all pass validation and fit in
        the write cache's active half, is accepted as a run (`_accept_run`): its per-entry work runs in C loops."""
        batch = AddBatch(len(entries))
        if self._started_as_run(entries, master_key, flags, batch):
            return batch
        return self._start_adds([(entry, master_key, flags) for entry in entries], batch)

    def _started_as_run(self, entries: Sequence[bytes], master_key: bytes, flags: int, batch: "AddBatch") -> bool:
        """The batch accepted as a run and queued for the journal; False (nothing changed) when it cannot be."""
        if self._closing or self._journal.failed is not None or not self._accept_run(entries, master_key, flags,
                                                                                      batch):
            return False
        self.stats["adds"] += len(entries)
        self._journal_batch(batch)
        return True

    def _start_adds(self, items: Sequence[tuple[bytes, bytes, int]], batch: "AddBatch") -> "AddBatch":
        if self._closing or self._journal.failed is not None:
            why = "bookie is shutting down" if self._closing else f"journal failed: {self._journal.failed}"
            batch.fail_accepted(StatusCode.IO_ERROR, why)
            return batch
        self.stats["adds"] += len(items)
        stopped_at = self._accept(items, 0, batch)
        if stopped_at < len(items):
            batch.durable = asyncio.get_running_loop().create_task(self._accept_throttled(items, stopped_at, batch))
        else:
            self._journal_batch(batch)
        return batch

    def _accept(self, items: Sequence[tuple[bytes, bytes, int]], start: int, batch: "AddBatch") -> int:
        """Validate and cache items[start:], queueing their journal records in `batch`. Returns len(items), or
        the index of the first entry the full write cache could not take.

        This is the hot path: the per-ledger checks run once per run of same-ledger entries.
        """
        chunks = batch.chunks  # journal records as (prefix, body) chunks: the entry bytes are not copied
        append = chunks.append
        nrecords = 0
        cache_put = self._write_cache.put
        size_max = self._entry_bytes_max
        checked: tuple | None = None  # (ledger id, master key, flags) that passed the per-ledger checks
        run_lac = -1  # highest piggybacked LAC in the current run of the checked ledger
        stopped_at = len(items)
        for i in range(start, len(items)):
            entry, master_key, flags = items[i]
            size = len(entry)
            if size < _HEADER_BYTES or size > size_max:
                batch.reject(i, StatusCode.BAD_REQUEST, f"entry of {size} bytes outside [{_HEADER_BYTES}, "
                                                        f"{size_max}] (entry_bytes_max / half the write cache)")
                continue
            ledger_id, entry_id, lac = _IDS.unpack_from(entry)
            if checked is None or checked[0] != ledger_id or checked[1] != master_key or checked[2] != flags:
                if checked is not None:
                    self._note_lac(checked[0], run_lac)
                    checked, run_lac = None, -1
                status, why = self._check_ledger(ledger_id, master_key, flags)
                if status is not OK:
                    batch.reject(i, status, why)
                    continue
                self._generation += 1
                self._seen[ledger_id] = self._generation
                record = self._ledgers.get(ledger_id)
                if record is None or not record.master_key:
                    self._ledgers.update(ledger_id, master_key=master_key)
                    append(jfmt.master_key_record(ledger_id, master_key))
                    nrecords += 1
                checked = (ledger_id, master_key, flags)
            if entry_id < 0:
                batch.reject(i, StatusCode.BAD_REQUEST, f"invalid entry id {entry_id}")
                continue
            if not cache_put(ledger_id, entry_id, entry):
                stopped_at = i
                break
            if lac > run_lac:
                run_lac = lac
            recovery = flags & FLAG_RECOVERY_ADD
            append(_pack_prefix(size + _LENGTH_MIN, crc32c(entry, _ENTRY_CRC_SEED[recovery]), _ENTRY, recovery))
            append(entry)
            nrecords += 1
        if checked is not None:
            self._note_lac(checked[0], run_lac)
        batch.nrecords += nrecords
        return stopped_at

    def _accept_run(self, entries: Sequence[bytes], master_key: bytes, flags: int, batch: "AddBatch") -> bool:
        """_accept of (entry, master_key, flags) for each of `entries` when its outcome is known up front: every
        entry within the size bounds, one ledger that passes its checks, entry ids ascending from >= 0, and room
        in the active write-cache half for all of them (nothing in it replaced). Then everything is accepted as
        _accept would, by C loops over the entries, and True is returned; else False, and nothing changed."""
        n = len(entries)
        if not n:
            return False
        sizes = list(map(len, entries))
        if min(sizes) < _HEADER_BYTES or max(sizes) > self._entry_bytes_max:
            return False
        ids = list(map(_IDS.unpack_from, entries))  # (ledger id, entry id, lac) of each entry
        ledger_id = ids[0][0]
        entry_ids = list(map(_SECOND, ids))
        if (entry_ids[0] < 0 or not all(map(lt, entry_ids, islice(entry_ids, 1, None)))
                or set(map(_FIRST, ids)) != {ledger_id}):
            return False
        if self._check_ledger(ledger_id, master_key, flags)[0] is not OK:
            return False
        if not self._write_cache.put_run(ledger_id, entry_ids, entries, sum(sizes)):
            return False
        self._generation += 1
        self._seen[ledger_id] = self._generation
        chunks = batch.chunks
        record = self._ledgers.get(ledger_id)
        if record is None or not record.master_key:
            self._ledgers.update(ledger_id, master_key=master_key)
            chunks.append(jfmt.master_key_record(ledger_id, master_key))
            batch.nrecords += 1
        self._note_lac(ledger_id, max(map(_THIRD, ids)))
        recovery = flags & FLAG_RECOVERY_ADD
        prefixes = map(_pack_prefix, map(add, sizes, repeat(_LENGTH_MIN)),
                       map(crc32c, entries, repeat(_ENTRY_CRC_SEED[recovery])), repeat(_ENTRY), repeat(recovery))
        chunks.extend(chain.from_iterable(zip(prefixes, entries)))
        batch.nrecords += n
        return True

    def _touch(self, ledger_id: int) -> None:
        """Garbage collection must not delete this ledger in a round whose metadata read began before now."""
        self._generation += 1
        self._seen[ledger_id] = self._generation

    def _note_lac(self, ledger_id: int, lac: int) -> None:
        """Remember the highest piggybacked LAC seen for a ledger (LacMonotonic: never lowered)."""
        if lac > self._lac.get(ledger_id, -1):
            self._lac[ledger_id] = lac

    async def _accept_throttled(self, items: Sequence[tuple[bytes, bytes, int]], start: int,
                                batch: "AddBatch") -> None:
        """The write cache filled at items[start]: wait for room (one write_cache_throttle_ms_max budget per
        batch, a checkpoint frees a half), go on with the rest, then journal the batch."""
        self.stats["throttled"] += 1
        deadline = self._clock.monotonic_ms() + self.config.write_cache_throttle_ms_max
        i = start
        while i < len(items):
            if await self._wait_for_cache_room(len(items[i][0]), deadline):
                i = self._accept(items, i, batch)  # state may have changed while waiting: checks run again
            else:
                batch.reject(i, StatusCode.TOO_MANY_REQUESTS, f"write cache full for "
                             f"{self.config.write_cache_throttle_ms_max} ms (write_cache_throttle_ms_max)")
                i += 1
        self._journal_batch(batch)
        if batch.durable is not None:
            await batch.durable

    def _journal_batch(self, batch: "AddBatch") -> None:
        """Queue the batch's journal records; its `durable` future resolves after the covering sync."""
        if not batch.chunks:
            batch.durable = None
            return
        try:
            batch.durable = self._journal.append_many(batch.chunks, batch.nrecords)
        except BookieError as e:
            batch.durable = None
            batch.fail_accepted(e.status, e.message)

    def _check_ledger(self, ledger_id: int, master_key: bytes, flags: int) -> tuple[StatusCode, str]:
        """Per-ledger validation in the order of PROTOCOL.md §2.1 (after the entry-size check)."""
        recovery = flags & FLAG_RECOVERY_ADD
        if self._read_only and not (recovery and self._free_bytes > self.config.recovery_add_reserve_bytes):
            return StatusCode.READ_ONLY, "bookie is read-only (disk usage above threshold)"
        if ledger_id < 0:
            return StatusCode.BAD_REQUEST, f"invalid ledger id {ledger_id}"
        record = self._ledgers.get(ledger_id)
        if record is not None:
            if record.master_key and not hmac.compare_digest(record.master_key, master_key):
                return StatusCode.UNAUTHORIZED, f"master key mismatch for ledger {ledger_id}"
            if record.fenced and not recovery:
                return StatusCode.FENCED, f"ledger {ledger_id} is fenced"
        if not master_key:
            return StatusCode.BAD_REQUEST, "missing master key"
        return OK, ""

    async def _wait_for_cache_room(self, size: int, deadline: float) -> bool:
        """Trigger a checkpoint and wait until the active write-cache half has room for `size` bytes, or until
        `deadline`. True if there is room."""
        while not self._write_cache.has_room(size):
            self._request_checkpoint()
            self._cache_room.clear()
            remaining_ms = deadline - self._clock.monotonic_ms()
            if remaining_ms <= 0:
                return False
            try:
                await asyncio.wait_for(self._cache_room.wait(), remaining_ms / 1000.0)
            except TimeoutError:
                pass
        return True

    # -- fencing and LAC ---------------------------------------------------------------------------------
    async def _journal_and_wait(self, records: list[bytes]) -> tuple[StatusCode, str]:
        try:
            await self._journal.append_many(records, len(records))
        except BookieError as e:
            return e.status, e.message
        return OK, ""

    def _check_key(self, ledger_id: int, master_key: bytes) -> tuple[StatusCode, str]:
        record = self._ledgers.get(ledger_id)
        if record is not None and record.master_key and not hmac.compare_digest(record.master_key, master_key):
            return StatusCode.UNAUTHORIZED, f"master key mismatch for ledger {ledger_id}"
        return OK, ""

    async def _fence(self, ledger_id: int, master_key: bytes) -> tuple[StatusCode, str]:
        """Set and journal the fenced bit (creating the ledger record if unknown); wait for the sync.

        A ledger already durably fenced answers at once, and a fence whose journal sync is in flight is waited
        for, not journaled again (BookKeeper's fenceAndLogInJournal does the same): recovery reads forward with
        FENCE on every read, and a journal sync per read would make recovery crawl."""
        status, why = self._check_key(ledger_id, master_key)
        if status is not OK:
            return status, why
        if not master_key:
            return StatusCode.BAD_REQUEST, "a fencing read needs the master key"
        in_flight = self._fence_syncs.get(ledger_id)
        if in_flight is not None:
            return await asyncio.shield(in_flight)
        record = self._ledgers.get(ledger_id)
        if record is not None and record.fenced and ledger_id not in self._fence_unconfirmed:
            return OK, ""
        records = []
        if record is None or not record.master_key:
            records.append(jfmt.master_key_record(ledger_id, master_key))
        self._touch(ledger_id)
        self._ledgers.update(ledger_id, master_key=master_key, fenced=True)
        records.append(jfmt.fence_record(ledger_id))
        self.stats["fences"] += 1
        self._fence_unconfirmed.add(ledger_id)
        task = asyncio.get_running_loop().create_task(self._journal_fence(ledger_id, records))
        self._fence_syncs[ledger_id] = task
        return await asyncio.shield(task)

    async def _journal_fence(self, ledger_id: int, records: list[bytes]) -> tuple[StatusCode, str]:
        try:
            status, why = await self._journal_and_wait(records)
            if status is OK:
                self._fence_unconfirmed.discard(ledger_id)
            return status, why
        finally:
            self._fence_syncs.pop(ledger_id, None)

    async def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> tuple[StatusCode, str]:
        if self._closing:
            return StatusCode.IO_ERROR, "bookie is shutting down"
        if ledger_id < 0:
            return StatusCode.BAD_REQUEST, f"invalid ledger id {ledger_id}"
        status, why = self._check_key(ledger_id, master_key)
        if status is not OK:
            return status, why
        if not master_key:
            return StatusCode.BAD_REQUEST, "missing master key"
        record = self._ledgers.get(ledger_id)
        records = []
        self._touch(ledger_id)
        if record is None or not record.master_key:
            records.append(jfmt.master_key_record(ledger_id, master_key))
            self._ledgers.update(ledger_id, master_key=master_key)
            record = self._ledgers.get(ledger_id)
        if record.explicit_lac is None or lac > record.explicit_lac:
            self._ledgers.update(ledger_id, explicit_lac=lac)
        records.append(jfmt.explicit_lac_record(ledger_id, lac))
        return await self._journal_and_wait(records)

    def _known_lac(self, ledger_id: int) -> int:
        """max(piggybacked LACs seen since start, the LAC inside the last entry that was already durable in the
        entry logs at first use, explicit LAC): never below what the bookie could answer before a restart.
        Raises FormatError if that last entry is unreadable or fails its digest."""
        base = self._base_lac.get(ledger_id)
        if base is None:
            base = self._base_lac[ledger_id] = self._lac_in_last_indexed_entry(ledger_id)
        lac = max(self._lac.get(ledger_id, -1), base)
        record = self._ledgers.get(ledger_id)
        if record is not None and record.explicit_lac is not None:
            lac = max(lac, record.explicit_lac)
        return lac

    def _lac_lower_bound(self, ledger_id: int) -> int:
        """The known LAC without the last entry's (unreadable): piggybacked LACs seen since start, explicit LAC."""
        record = self._ledgers.get(ledger_id)
        explicit = record.explicit_lac if record is not None and record.explicit_lac is not None else -1
        return max(self._lac.get(ledger_id, -1), explicit)

    def _lac_in_last_indexed_entry(self, ledger_id: int) -> int:
        last = self._locations.last_entry_id(ledger_id)
        if last < 0:
            return -1
        location = self._locations.get(ledger_id, last)
        entry = self._entry_logger.read(location, ledger_id, last)
        if entry[32:36] != b"\0\0\0\0":  # a CRC32C digest: check it before trusting the LAC field
            entry_fmt.decode_entry(entry, entry_fmt.DIGEST_CRC32C, ledger_id, last)
        return _IDS.unpack_from(entry)[2]

    # -- read path ---------------------------------------------------------------------------------------
    def _last_entry_id(self, ledger_id: int) -> int:
        return max(self._write_cache.last_entry_id(ledger_id), self._locations.last_entry_id(ledger_id))

    def _get(self, ledger_id: int, entry_id: int) -> bytes | None:
        """Write cache -> flushing cache -> read cache -> index + entry log. Raises FormatError if damaged."""
        entry = self._write_cache.get(ledger_id, entry_id)
        if entry is None:
            entry = self._read_cache.get(ledger_id, entry_id)
        if entry is None:
            location = self._locations.get(ledger_id, entry_id)
            if location is None:
                return None
            entry = self._entry_logger.read(location, ledger_id, entry_id)
            self._read_cache.put(ledger_id, entry_id, entry)
        return entry

    async def read_entry(self, ledger_id: int, entry_id: int, fence: bool = False,
                         master_key: bytes = b"") -> tuple[StatusCode, bytes, int, str]:
        """Returns (status, entry bytes, known LAC, message). entry_id -1 = last entry stored here."""
        if self._closing:
            return StatusCode.IO_ERROR, b"", -1, "bookie is shutting down"
        self.stats["reads"] += 1
        if ledger_id < 0:  # never a ledger (nor one in limbo)
            return StatusCode.BAD_REQUEST, b"", -1, f"invalid ledger id {ledger_id}"
        if fence:
            status, why = await self._fence(ledger_id, master_key)
            if status is not OK:
                return status, b"", -1, why
        if entry_id < -1:
            return StatusCode.BAD_REQUEST, b"", -1, f"invalid entry id {entry_id}"
        try:
            last = self._last_entry_id(ledger_id)
            wanted = last if entry_id == -1 else entry_id
            entry = self._get(ledger_id, wanted) if wanted >= 0 else None
        except FormatError as e:
            return StatusCode.IO_ERROR, b"", -1, f"entry {ledger_id}:{entry_id} unreadable: {e}"
        try:
            lac = self._known_lac(ledger_id)
        except FormatError as e:
            if entry is None:  # "no such entry" would come with a LAC this bookie cannot read: unknown, not no
                return StatusCode.IO_ERROR, b"", -1, f"entry {ledger_id}:{entry_id} unreadable: {e}"
            lac = self._lac_lower_bound(ledger_id)  # the entry is intact: served, with what is known of the LAC
        if entry is None:
            if ledger_id <= self.limbo_ledger_id_max:
                return StatusCode.UNKNOWN_STATE, b"", lac, self._limbo_message(ledger_id, entry_id)
            if ledger_id not in self._ledgers and last < 0:
                return StatusCode.NO_LEDGER, b"", -1, f"ledger {ledger_id} not on this bookie"
            return StatusCode.NO_ENTRY, b"", lac, f"entry {ledger_id}:{entry_id} not on this bookie"
        return OK, entry, lac, ""

    async def read_lac(self, ledger_id: int) -> tuple[StatusCode, int, int, str]:
        """Returns (status, known LAC, last entry id stored here, message)."""
        if self._closing:
            return StatusCode.IO_ERROR, -1, -1, "bookie is shutting down"
        if ledger_id < 0:
            return StatusCode.BAD_REQUEST, -1, -1, f"invalid ledger id {ledger_id}"
        try:
            last = self._last_entry_id(ledger_id)
            if last < 0 and ledger_id <= self.limbo_ledger_id_max:
                return StatusCode.UNKNOWN_STATE, -1, -1, self._limbo_message(ledger_id, -1)
            if ledger_id not in self._ledgers and last < 0:
                return StatusCode.NO_LEDGER, -1, -1, f"ledger {ledger_id} not on this bookie"
            return OK, self._known_lac(ledger_id), last, ""
        except FormatError as e:
            return StatusCode.IO_ERROR, -1, -1, f"ledger {ledger_id} last entry unreadable: {e}"

    async def list_entries(self, ledger_id: int, first_entry: int = 0, *, ids_max: int | None = None,
                           ranges_max: int | None = None) -> tuple[StatusCode, list[tuple[int, int]], int, str]:
        """Which entries of the ledger this bookie holds, from `first_entry` on (BookKeeper's
        GET_LIST_OF_ENTRIES_OF_LEDGER): (status, ranges, next entry, message), the ranges sorted, disjoint,
        non-adjacent and inclusive, over both write-cache halves and the location index (so what replay put back
        counts).

        One page (bookie/requests.py "ListEntries"): at most `ids_max` ids (default `list_entries_ids_max`) in
        at most `ranges_max` ranges (default: what fits in frame_bytes_max); next entry is where the next page
        starts, -1 when this one reaches the ledger's end. The index is read lazily from one seek and ranges
        are built as it goes, so the work is bounded by `ids_max`; nothing is awaited, so a page is one
        consistent view (a checkpoint moves entries from the cache to the index between pages, never during).

        OK with [] for a ledger known here without entries; NO_LEDGER for one this bookie never held;
        UNKNOWN_STATE for a ledger in limbo (an earlier incarnation may have held entries that are gone);
        IO_ERROR for a malformed index key; BAD_REQUEST for a negative ledger or entry id."""
        if self._closing:
            return StatusCode.IO_ERROR, [], -1, "bookie is shutting down"
        self.stats["lists"] += 1
        if ledger_id < 0 or first_entry < 0:
            return StatusCode.BAD_REQUEST, [], -1, f"ListEntries of ledger {ledger_id} from entry {first_entry}: " \
                                                   f"ids are >= 0"
        if ledger_id <= self.limbo_ledger_id_max:
            return StatusCode.UNKNOWN_STATE, [], -1, (
                f"ledger {ledger_id} is in limbo (id <= {self.limbo_ledger_id_max}, the bound this bookie's format "
                f"recorded): an earlier incarnation may have held entries it no longer has")
        ids_max = self.config.list_entries_ids_max if ids_max is None else ids_max
        ranges_max = list_ranges_max(self.config) if ranges_max is None else ranges_max
        firsts: list[int] = []
        lasts: list[int] = []
        next_entry = -1
        last = -2  # the last id taken
        taken = 0
        indexed = self._locations.entry_ids(ledger_id, first_entry)
        cached = self._write_cache.entry_ids(ledger_id, first_entry)
        try:
            for entry_id in heapq.merge(cached, indexed) if cached else indexed:
                if entry_id == last:
                    continue  # in the flushing half and already in the index
                if taken == ids_max:
                    next_entry = entry_id
                    break
                if entry_id == last + 1:
                    lasts[-1] = entry_id
                elif len(firsts) == ranges_max:
                    next_entry = entry_id
                    break
                else:
                    firsts.append(entry_id)
                    lasts.append(entry_id)
                last = entry_id
                taken += 1
        except FormatError as e:
            return StatusCode.IO_ERROR, [], -1, f"ledger {ledger_id}: location index unreadable: {e}"
        finally:
            indexed.close()
        if not firsts and ledger_id not in self._ledgers and self._last_entry_id(ledger_id) < 0:
            return StatusCode.NO_LEDGER, [], -1, f"ledger {ledger_id} not on this bookie"
        return OK, list(zip(firsts, lasts)), next_entry, ""

    def _limbo_message(self, ledger_id: int, entry_id: int) -> str:
        what = "no entry" if entry_id == -1 else f"entry {ledger_id}:{entry_id} not"
        return (f"{what} here, but ledger {ledger_id} is in limbo (id <= {self.limbo_ledger_id_max}, the bound this "
                f"bookie's format recorded): an earlier incarnation may have held it")

    # -- replay ------------------------------------------------------------------------------------------
    # Replay (bookie/replay.py) hands `_apply_records` the journal's records a list at a time. Entries go into the
    # active write-cache half; when it is full (or, between two lists while no checkpoint runs, holds a
    # REPLAY_EARLY_SWAP_FRACTION of a half), `_replay_swap` makes it the flushing half and checkpoints it in a task
    # (`_replay_checkpoint`, steps 3-7) while replay fills the other half, yielding to the task after each list;
    # replay waits only when that half fills too before the checkpoint has finished. The mark such a checkpoint
    # persists is the start of the group of the record that did not fit (or of the list's last record): every
    # record before it was applied before the swap, so it is in the half being flushed (or in one flushed
    # before: one checkpoint runs at a time, in order), its ledger-index changes are in the store by step 6
    # (`LedgerIndex.flush` takes what is dirty when it starts), and replay resumes there after a crash, applying
    # that group's earlier records again. Ledger-index changes of later records may reach the store with it:
    # they are in the synced journal after the mark, and applying them again changes nothing (a key is kept once
    # set, fenced stays set, an explicit LAC only rises). Start-up waits for the last of these checkpoints before
    # its own; when replay fails it lets a running one end, when start-up is cancelled it cancels it.

    async def _apply_records(self, journal_id: int, records: list[jfmt.JournalRecord]) -> None:
        """Re-apply journal records of journal `journal_id`, in order (idempotent). Entries are taken in runs of
        one ledger as `_accept` takes adds: one unpack per entry; the ledger's record, its touch and its LAC once
        per run. The fenced check does not apply to replayed adds."""
        put = self._write_cache.put
        unpack_ids = _IDS.unpack_from
        ledgers = self._ledgers
        run_ledger: int | None = None  # the ledger of the current run of ENTRY records
        run_lac = -1  # the highest piggybacked LAC in that run
        for record in records:
            if record.type is not _ENTRY_RECORD:
                if run_ledger is not None:
                    self._end_replay_run(run_ledger, run_lac)
                    run_ledger = None
                self._apply_ledger_record(record)
                continue
            body = record.body
            ledger_id, entry_id, lac = unpack_ids(body)
            if ledger_id != run_ledger:
                if run_ledger is not None:
                    self._end_replay_run(run_ledger, run_lac)
                run_ledger, run_lac = ledger_id, -1
                if ledger_id not in ledgers:
                    ledgers.update(ledger_id)
            if not put(ledger_id, entry_id, body):
                await self._replay_swap(JournalMark(journal_id, record.group))
                if not put(ledger_id, entry_id, body):
                    raise BksimError(f"journal entry {ledger_id}:{entry_id} of {len(body)} bytes does not fit half "
                                     f"the write cache (write_cache_bytes_max={self.config.write_cache_bytes_max}): "
                                     f"raise write_cache_bytes_max to replay this journal")
            if lac > run_lac:
                run_lac = lac
        if run_ledger is not None:
            self._end_replay_run(run_ledger, run_lac)
        flush = self._replay_flush
        if flush is not None and not flush.done():
            await asyncio.sleep(0)  # the checkpoint's task goes on with its next step (its I/O runs off the loop)
        elif self._write_cache.active_bytes >= self._write_cache.half_bytes_max // REPLAY_EARLY_SWAP_FRACTION:
            await self._replay_swap(JournalMark(journal_id, records[-1].group))

    def _end_replay_run(self, ledger_id: int, lac: int) -> None:
        self._note_lac(ledger_id, lac)
        self._touch(ledger_id)

    def _apply_ledger_record(self, record: jfmt.JournalRecord) -> None:
        """Re-apply one MASTER_KEY, FENCE, EXPLICIT_LAC (or PADDING: nothing) record."""
        body = record.body
        rtype = record.type
        if rtype == jfmt.RecordType.MASTER_KEY:
            ledger_id = jfmt.LEDGER_ID.unpack_from(body)[0]
            self._touch(ledger_id)
            existing = self._ledgers.get(ledger_id)
            if existing is None or not existing.master_key:
                self._ledgers.update(ledger_id, master_key=bytes(body[8:]))
        elif rtype == jfmt.RecordType.FENCE:
            ledger_id = jfmt.LEDGER_ID.unpack_from(body)[0]
            self._touch(ledger_id)
            self._ledgers.update(ledger_id, fenced=True)
        elif rtype == jfmt.RecordType.EXPLICIT_LAC:
            ledger_id, lac = jfmt.LEDGER_LAC.unpack_from(body)
            self._touch(ledger_id)
            existing = self._ledgers.get(ledger_id)
            if existing is None or existing.explicit_lac is None or lac > existing.explicit_lac:
                self._ledgers.update(ledger_id, explicit_lac=lac)

    async def _replay_swap(self, mark: JournalMark) -> None:
        """Checkpoint the active write-cache half in a task, persisting `mark` (the start of a group none of whose
        records is in a later half): wait for replay's checkpoint of the other half if it still runs, then swap."""
        if not self._write_cache.active_bytes:
            return  # nothing to hand over: the record does not fit even an empty half
        await self._replay_flushed()
        runs = self._write_cache.swap()  # 2.
        task = asyncio.get_running_loop().create_task(self._replay_checkpoint(runs, mark), name="replay-checkpoint")
        self._replay_flush = task
        self._tasks.append(task)
        task.add_done_callback(lambda t: t in self._tasks and self._tasks.remove(t))

    async def _replay_checkpoint(self, runs: list, mark: JournalMark) -> None:
        """Checkpoint steps 3-7 for the half `_replay_swap` swapped, persisting `mark` (section comment above)."""
        step = self._fault_hook
        async with self._checkpoint_lock:
            started_ms = self._clock.monotonic_ms()
            mark = max(mark, self._persisted_mark)
            step("mark")
            await self._write_half(runs, mark, step, started_ms)

    async def _replay_flushed(self) -> None:
        """Wait for replay's running checkpoint, if any; raises what it raised."""
        task, self._replay_flush = self._replay_flush, None
        if task is not None:
            await task

    async def _replay_flush_settled(self) -> None:
        """Replay failed: let its running checkpoint end (it is a sound checkpoint, and its writes must not outlive
        the start-up that made them); a failure of its own is logged, replay's is the one raised."""
        task, self._replay_flush = self._replay_flush, None
        if task is not None:
            (outcome,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(outcome, BaseException):
                self._log(f"journal replay: its checkpoint failed too: {type(outcome).__name__}: {outcome}")

    def _replay_flush_cancelled(self) -> None:
        """Start-up was cancelled: so is replay's running checkpoint (what it leaves is a crash's)."""
        task, self._replay_flush = self._replay_flush, None
        if task is not None:
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    # -- checkpoint --------------------------------------------------------------------------------------
    def _request_checkpoint(self) -> None:
        """An add found the write cache full: queue one checkpoint behind whatever holds the checkpoint lock now
        (a checkpoint that already swapped its half and is finishing, garbage collection), so the request is
        never lost to a lock about to be released. Requests while one is queued join it."""
        if self._checkpoint_queued or self._closing:
            return
        self._checkpoint_queued = True
        task = asyncio.get_running_loop().create_task(self._queued_checkpoint(), name="checkpoint-now")
        self._tasks.append(task)
        task.add_done_callback(lambda t: t in self._tasks and self._tasks.remove(t))

    async def _queued_checkpoint(self) -> None:
        started = False
        try:
            async with self._checkpoint_lock:
                started, self._checkpoint_queued = True, False  # a request from now on queues the next one
                await self._checkpoint_locked()
        except Exception as e:
            self._log(f"checkpoint failed: {type(e).__name__}: {e}")
        finally:
            if not started:  # cancelled while waiting for the lock
                self._checkpoint_queued = False

    async def _checkpoint_quietly(self) -> None:
        try:
            await self.checkpoint()
        except Exception as e:
            self._log(f"checkpoint failed: {type(e).__name__}: {e}")

    async def _checkpoint_loop(self) -> None:
        wait_ms = self._first_checkpoint_ms
        while True:
            await self._clock.sleep_ms(wait_ms)
            await asyncio.shield(self._checkpoint_quietly())
            wait_ms = self.config.flush_interval_ms

    async def checkpoint(self, mark: JournalMark | None = None) -> None:
        """Make everything in the write cache durable in entry logs + index, then persist the mark.

        `mark` (replay only) overrides the journal's synced mark.
        """
        async with self._checkpoint_lock:
            await self._checkpoint_locked(mark)

    async def _checkpoint_locked(self, mark: JournalMark | None = None) -> None:
        started_ms = self._clock.monotonic_ms()
        step = self._fault_hook
        m = self._journal.synced_mark if mark is None else mark  # 1. every record before M is synced
        if m < self._persisted_mark:
            m = self._persisted_mark  # maybe: nothing new was synced since the mark was last persisted
        step("mark")
        if self._write_cache.flushing_bytes:  # maybe: an earlier checkpoint failed after its swap
            await self._flush_half(self._write_cache.flushing_runs(), step)
            self._write_cache.flushed()
        runs = self._write_cache.swap()  # 2.
        self._cache_room.set()  # adds waiting for room can go on while this half is flushed
        await self._write_half(runs, m, step, started_ms)

    async def _write_half(self, runs: list, mark: JournalMark, step: Callable[[str], None], started_ms: float) -> None:
        """Checkpoint steps 3-7 for a swapped write-cache half (a checkpoint's or replay's), then the journals
        entirely below `mark` are collected and the checkpoint counted."""
        await self._flush_half(runs, step)  # 3.-5.
        self._write_cache.flushed()
        await self._ledgers.flush()  # 6.
        step("ledger_index_write")
        await self._persist_mark(mark)  # 7.
        step("lastmark_write")
        self._cache_room.set()
        await self._collect_journals(mark)
        self.stats["checkpoints"] += 1
        self.flush_latency.observe(self._clock.monotonic_ms() - started_ms)

    async def _flush_half(self, runs: list, step: Callable[[str], None]) -> None:
        """Checkpoint steps 3-5 for one swapped write-cache half (per-ledger runs, sorted)."""
        step("swap")
        locations = await self._entry_logger.append_sorted(runs)  # 3.
        step("entrylog_write")
        await self._entry_logger.flush()  # 4.
        step("entrylog_sync")
        await self._locations.put_batch(locations)  # 5.
        self._read_cache.discard_runs(runs)  # reads of these entries now go to their new locations
        step("index_write")

    async def _persist_mark(self, mark: JournalMark) -> None:
        assert mark >= self._persisted_mark, f"lastmark would regress: {mark} < {self._persisted_mark}"
        if mark == self._persisted_mark and self._disk.exists(os.path.join(self.ledger_dir, LASTMARK_FILE)):
            return
        await self._disk.atomic_write(os.path.join(self.ledger_dir, LASTMARK_FILE), encode_lastmark(mark))
        self._persisted_mark = mark

    async def _collect_journals(self, mark: JournalMark) -> None:
        """Delete (or archive) journals entirely below the mark, keeping `journal_backups_max` of them."""
        below = [i for i in list_journal_ids(self._disk, self.journal_dir) if i < mark.journal_id]
        doomed = below[:max(0, len(below) - self.config.journal_backups_max)]
        archive = self.config.journal_archive_dir
        if not doomed:
            return
        if archive:
            self._disk.makedirs(archive)
        for journal_id in doomed:
            path = os.path.join(self.journal_dir, jfmt.journal_file_name(journal_id))
            if archive:
                self._disk.rename(path, os.path.join(archive, jfmt.journal_file_name(journal_id)))
            else:
                self._disk.remove(path)
        if archive:
            await self._disk.sync_dir(archive)
        await self._disk.sync_dir(self.journal_dir)


    # -- garbage collection and compaction (policy: bookie/gc.py) ----------------------------------------
    async def refresh_log_meta(self) -> None:
        """Give every sealed log a metadata record: the map of a log rolled since (kept in memory by the entry
        logger), else the map in its header, else a scan (a log a crash left unsealed: once); drop records of
        logs that are gone. Called by each GC round, so neither start-up nor checkpoints wait for it. The set of
        logs is taken under the checkpoint lock: a log rolled by a running checkpoint (not yet synced nor
        indexed) is left to the next round."""
        if self._closing:
            raise BookieError(StatusCode.IO_ERROR, "bookie is shutting down: no garbage collection")
        async with self._checkpoint_lock:
            rolled = dict(self._entry_logger.take_sealed())
            current = self._entry_logger.current_log_id
            on_disk = [i for i in self._entry_logger.log_ids() if i != current]
        known = set(self._log_meta.log_ids())
        puts: dict[int, dict[int, int]] = {}
        scanned = 0
        for log_id in on_disk:
            if log_id not in known:
                found = rolled.get(log_id)
                if found is None:
                    found = self._entry_logger.ledger_map(log_id)
                if found is None:
                    found = self._entry_logger.scan_ledger_bytes(log_id)
                    scanned += 1
                puts[log_id] = found
        gone = sorted(known - set(on_disk))
        if puts or gone:
            await self._log_meta.write(puts, gone)
        if scanned or gone:
            self._log(f"entry-log metadata: {len(puts)} log(s) recorded ({scanned} scanned), "
                      f"{len(gone)} record(s) of deleted logs dropped")

    @property
    def disk_full(self) -> bool:
        """Read-only because of disk usage (garbage collection runs at once and compacts at the major threshold)."""
        return self._read_only

    @property
    def gc_generation(self) -> int:
        """Read this before a metadata read starts; pass it to delete_ledgers."""
        return self._generation

    def gc_ledger_ids(self) -> list[int]:
        """The ledgers this bookie holds (its ledger index), sorted."""
        return self._ledgers.ledger_ids()

    def gc_untouched_since(self, ledger_id: int, generation: int) -> bool:
        return self._seen.get(ledger_id, 0) <= generation

    async def delete_ledgers(self, ledger_ids, generation: int) -> list[int]:
        """Delete the local data of ledgers the metadata store no longer has (engine docstring, "Garbage
        collection"). Only ledgers untouched since `generation` go; returns those deleted."""
        step = self._fault_hook
        async with self._checkpoint_lock:
            await self._checkpoint_locked()
            doomed = sorted(lid for lid in set(ledger_ids) if lid in self._ledgers and lid not in self._fence_syncs
                            and self.gc_untouched_since(lid, generation))
            if not doomed:
                return []
            keys: list[bytes] = []
            for lid in doomed:
                keys.extend(self._locations.keys_of(lid))
            gone = set(doomed)
            for lid in doomed:  # from here on the ledger is unknown to reads; a new add re-creates it
                self._ledgers.remove(lid)
                for table in (self._lac, self._base_lac, self._seen):
                    table.pop(lid, None)
                self._fence_unconfirmed.discard(lid)
            self._read_cache.drop_ledgers(gone)
            if keys:
                await self._locations.delete_batch(keys)
            # again: a read while the batch was written may have cached an entry, or the LAC of the last one
            self._read_cache.drop_ledgers(gone)
            for lid in doomed:
                self._base_lac.pop(lid, None)
            step("gc_index_delete")
            await self._ledgers.flush()
            step("gc_ledger_delete")
        self.stats["gc_ledgers_deleted"] += len(doomed)
        return doomed

    def _log_live_bytes(self, ledger_bytes: dict[int, int]) -> int:
        return sum(n for lid, n in ledger_bytes.items() if lid in self._ledgers)

    async def delete_dead_logs(self) -> tuple[list[int], int]:
        """Delete every sealed entry log none of whose ledgers is present; returns (log ids, bytes freed)."""
        step = self._fault_hook
        current = self._entry_logger.current_log_id
        dead = [(log_id, m) for log_id, m in self._log_meta.items()
                if log_id != current and self._log_live_bytes(m) == 0
                and (index_fmt.UNKNOWN_LEDGER not in m or not self._locations.any_in_log(log_id))]
        for log_id, _m in dead:
            await self._entry_logger.remove(log_id)
            step("gc_log_delete")
        if dead:
            await self._log_meta.write({}, [log_id for log_id, _m in dead])
            step("gc_meta_delete")
            self.stats["gc_logs_deleted"] += len(dead)
        return [log_id for log_id, _m in dead], sum(sum(m.values()) for _log_id, m in dead)

    def entry_log_stats(self) -> list[dict]:
        """Every entry log: id, bytes of entry records, live bytes (ledgers still present), live ratio, ledger
        count and ids, and whether it is the one being written (never deleted or compacted)."""
        out = []
        logs = self._log_meta.items() + [(self._entry_logger.current_log_id, self._entry_logger.current_ledger_bytes())]
        for log_id, m in logs:
            total = sum(m.values())
            live = self._log_live_bytes(m)
            out.append({"log_id": log_id, "bytes": total, "live_bytes": live,
                        "live_ratio": live / total if total else 0.0, "ledgers": len(m),
                        "live_ledgers": sum(1 for lid in m if lid in self._ledgers),
                        "ledger_ids": sorted(m),
                        "current": log_id == self._entry_logger.current_log_id})
        return out

    def compaction_candidates(self, threshold: float) -> list[int]:
        """Sealed logs with some live data and a live ratio below `threshold`, sparsest first."""
        found = []
        for log_id, m in self._log_meta.items():
            total = sum(m.values())
            live = self._log_live_bytes(m)
            if total and 0 < live and live / total < threshold:
                found.append((live / total, log_id))
        return [log_id for _ratio, log_id in sorted(found)]

    async def compact_log(self, log_id: int, throttle=None) -> dict:
        """Copy the live entries of sealed log `log_id` into a new log and delete it (bookie/compaction.py).
        `throttle(nbytes)` is awaited after each copied run of records (the rate limit). Returns {"log_id",
        "new_log_id", "entries", "bytes_copied", "bytes_freed", "kept_old"}."""
        step = self._fault_hook
        old_meta = self._log_meta.get(log_id)
        assert old_meta is not None and log_id != self._entry_logger.current_log_id, \
            f"entry log {log_id:x} is not a sealed log"
        logger = self._entry_logger
        writer = CompactionWriter(self._disk, logger.directory, logger.next_log_id(), log_id)
        scan: dict = {}
        try:
            # the ledgers to copy, as a set taken now: a ledger deleted meanwhile has lost its index entries, so none
            # of its entries is moved (step 3); a ledger created meanwhile has nothing in a sealed log
            live = (set(self._ledgers.ledger_ids()) if index_fmt.UNKNOWN_LEDGER in old_meta
                    else {lid for lid in old_meta if lid in self._ledgers})
            copied, seen = await compaction.copy_live(self._disk, logger.path(log_id), log_id, live,
                                                      self._locations, writer, throttle, scan)
            new_path = await writer.seal(step) if writer.entries else None
        except (OSError, FormatError, asyncio.CancelledError):
            # an I/O error (a full disk), a record changed under the copy, or a stop: the index never saw the
            # new log, so it goes now; anything else is treated as the crash it stands for (fault hooks), and
            # start-up deals with the file
            writer.discard()
            raise
        if new_path is None:
            writer.discard()  # nothing live to copy: no new log
        else:
            logger.set_alias(writer.new_log_id, new_path)
        async with self._checkpoint_lock:
            puts = await compaction.index_moves(self._locations, copied)
            if puts:
                await self._locations.put_batch(puts)
            step("compact_index")
            if scan.get("clean") and index_fmt.UNKNOWN_LEDGER not in old_meta:
                left = await compaction.ledgers_pointing_into(self._locations, log_id, seen)
            else:  # the scan did not see every record: only the whole index can say nothing points here
                left = ["(some)"] if self._locations.any_in_log(log_id) else []
        if left:
            self._log(f"compaction of entry log {log_id:x}: ledger(s) {left[:5]} still have entries in it that its "
                      f"scan did not reach (a damaged record?): the log is kept")
        else:
            await logger.remove(log_id)
            step("compact_delete")
        if new_path is not None:
            logger.set_alias(writer.new_log_id, None)  # no await until the rename: no read sees neither name
            self._disk.rename(new_path, logger.path(writer.new_log_id))
            await self._disk.sync_dir(logger.directory)
            step("compact_rename")
        await self._log_meta.write({writer.new_log_id: writer.ledger_bytes} if new_path is not None else {},
                                   [] if left else [log_id])
        step("compact_meta")
        copied_bytes = sum(writer.ledger_bytes.values())
        self.stats["compacted_logs"] += 0 if left else 1
        return {"log_id": log_id, "new_log_id": writer.new_log_id if new_path else None, "entries": writer.entries,
                "bytes_copied": copied_bytes, "kept_old": bool(left),
                "bytes_freed": 0 if left else max(0, sum(old_meta.values()) - copied_bytes)}


class AddBatch:
    """An add batch in flight: per-entry statuses (OK = accepted, durable once `result()` returns), the
    journal records to write, and what to await for durability."""

    __slots__ = ("statuses", "message", "chunks", "nrecords", "durable")

    def __init__(self, n: int) -> None:
        self.statuses: list[StatusCode] = [OK] * n
        self.message = ""
        self.chunks: list[bytes] = []
        self.nrecords = 0
        self.durable: asyncio.Future | None = None

    def reject(self, i: int, status: StatusCode, why: str) -> None:
        self.statuses[i] = status
        if not self.message:
            self.message = why

    def fail_accepted(self, status: StatusCode, why: str) -> None:
        """Every accepted entry failed (journal failure): its outcome is `status`, never OK."""
        self.statuses = [status if s is OK else s for s in self.statuses]
        self.message = self.message or why

    def ready(self) -> bool:
        """Would `result()` return without waiting?"""
        return self.durable is None or self.durable.done()

    async def result(self) -> tuple[list[StatusCode], str]:
        """(statuses, first error message) once every OK entry is durable."""
        if self.durable is not None:
            try:
                await self.durable
            except BookieError as e:
                self.fail_accepted(e.status, e.message)
        return self.statuses, self.message
