"""The journal (write-ahead log) writer: group commit, fsync before acknowledgement, rolling.

Owns the journal files of one directory while the bookie runs. Replay is in bookie/replay.py.

Ordering contract: the future returned by `append_many(records)` resolves only after an fdatasync that
covers every byte of those records; only then may the bookie acknowledge the adds (PROTOCOL.md §2.2 step 4).

Sync placement (`sync_on_loop`): on the event loop (one blocking fdatasync per group, no thread hand-off)
or on a worker thread (the loop keeps serving while the device syncs). Either way one sync covers a group.

Group commit: one writer task takes queued records and writes+syncs them as one group when the oldest
record has waited `group_wait_ms_max`, or `group_bytes_max` bytes are queued, or (with `flush_when_idle`)
as soon as it finds the queue non-empty. While a sync is in flight, new records queue up and form the next
group, so the group size adapts to the device's sync latency. Each group write starts with a GROUP record
(the length and CRC of its records, formats/journal.py), so replay can tell a torn last group from damage.

Page cache (`remove_from_page_cache`, BookKeeper's journalRemoveFromPageCache, on by default): after a sync the
writer advises the OS to drop the file's synced pages, all but the last CACHE_DROP_LAG_BYTES, and a rolled file's
whole (bookie/page_cache.py). Only replay reads a journal, at start-up.

I/O errors: a failed write or sync kills the journal for good. The group being written and everything queued
behind it fail with IO_ERROR (their bytes may or may not be on the device; none was acknowledged), later
appends are refused, and `on_failure(reason)` tells the owner (the engine turns read-only).
"""
from __future__ import annotations

import asyncio
import collections
import os
from dataclasses import dataclass
from typing import Callable

from bksim.bookie.page_cache import SyncedPages
from bksim.formats import journal as fmt
from bksim.model.errors import BookieError
from bksim.model.histogram import LatencyHistogram
from bksim.model.status import StatusCode
from bksim.ports.clock import Clock
from bksim.ports.disk import AppendFile, Disk


CACHE_DROP_LAG_BYTES = 1 << 20  # the newest synced bytes of the file stay cached (its last page is still written)


@dataclass(frozen=True, slots=True, order=True)
class JournalMark:
    """A position in the journal history: (journal id, byte offset). Totally ordered."""
    journal_id: int
    offset: int


@dataclass(slots=True)
class _Pending:
    chunks: list[bytes]
    nrecords: int
    nbytes: int
    future: asyncio.Future
    enqueued_ms: float


def list_journal_ids(disk: Disk, journal_dir: str) -> list[int]:
    ids = (fmt.parse_journal_file_name(n) for n in disk.list_dir(journal_dir))
    return sorted(i for i in ids if i is not None)


class Journal:
    def __init__(self, disk: Disk, clock: Clock, journal_dir: str, instance_id: str, *, group_wait_ms_max: float,
                 group_bytes_max: int, flush_when_idle: bool, file_bytes_max: int, queue_records_max: int,
                 sync_on_loop: bool, log: Callable[[str], None] = print,
                 on_failure: Callable[[str], None] | None = None, remove_from_page_cache: bool = False) -> None:
        self._disk, self._clock, self._dir, self._instance_id = disk, clock, journal_dir, instance_id
        self._group_wait_ms_max = group_wait_ms_max
        self._group_bytes_max = group_bytes_max
        self._flush_when_idle = flush_when_idle or group_wait_ms_max <= 0
        self._file_bytes_max = file_bytes_max
        self._queue_records_max = queue_records_max
        self._sync_on_loop = sync_on_loop
        self._remove_from_page_cache = remove_from_page_cache
        self._pages: SyncedPages | None = None  # the current file's, when its pages leave the page cache
        self._log = log
        self._on_failure = on_failure  # called once, with the reason, when a write or sync fails
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_records = 0
        self._queued_bytes = 0
        self._wakeup = asyncio.Event()
        self._file: AppendFile | None = None
        self._file_id = 0
        self._synced = JournalMark(0, 0)
        self._task: asyncio.Task | None = None
        self._stopping = False
        self._failure: str | None = None
        self.stats = {"groups": 0, "records": 0, "bytes": 0, "rolls": 0}
        # latencies (exported as bookie_journal_JOURNAL_SYNC / _ADD_ENTRY): a group's write + sync, and a record's
        # queueing -> its covering sync (the time an add waits for durability here)
        self.sync_latency = LatencyHistogram()
        self.add_latency = LatencyHistogram()

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def open(self, after_id: int) -> None:
        """Start a new journal file whose id is above every existing one and above `after_id`."""
        existing = list_journal_ids(self._disk, self._dir)
        await self._roll(max(existing + [after_id]) + 1)

    def start(self) -> None:
        assert self._file is not None, "open() first"
        self._task = asyncio.get_running_loop().create_task(self._run(), name="journal-writer")

    async def stop(self) -> None:
        """Write and sync everything queued, then stop the writer and close the file."""
        self._stopping = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
            self._task = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def abandon(self) -> None:
        """Crash simulation for tests: stop without writing what is queued."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- state -------------------------------------------------------------------------------------------
    @property
    def synced_mark(self) -> JournalMark:
        """Every record before this mark is durable."""
        return self._synced

    @property
    def current_id(self) -> int:
        return self._file_id

    @property
    def failed(self) -> str | None:
        return self._failure

    def statistics(self) -> dict:
        return dict(self.stats, queued_records=self._queued_records, queued_bytes=self._queued_bytes,
                    file_id=self._file_id, synced=(self._synced.journal_id, self._synced.offset))

    # -- appending ---------------------------------------------------------------------------------------
    def append_many(self, chunks: list[bytes], nrecords: int) -> asyncio.Future:
        """Queue `nrecords` encoded records, given as byte chunks written back to back (a record may span
        chunks, so the caller need not copy entry bytes); the returned future resolves (None) after the
        fsync that covers all of them.

        Raises BookieError(TOO_MANY_REQUESTS) when the queue bound is reached, IO_ERROR after a journal failure.
        """
        if self._failure is not None:
            raise BookieError(StatusCode.IO_ERROR, f"journal failed: {self._failure}")
        if self._stopping:
            raise BookieError(StatusCode.IO_ERROR, "journal is stopping")
        if self._queued_records + nrecords > self._queue_records_max and self._queued_records > 0:
            raise BookieError(StatusCode.TOO_MANY_REQUESTS,
                              f"journal queue full ({self._queued_records} records queued)")
        future = asyncio.get_running_loop().create_future()
        nbytes = sum(map(len, chunks))
        self._queue.append(_Pending(chunks, nrecords, nbytes, future, self._clock.monotonic_ms()))
        self._queued_records += nrecords
        self._queued_bytes += nbytes
        self._wakeup.set()
        return future

    async def _run(self) -> None:
        group: list[_Pending] = []  # the group being written: on a failure its callers get the error too
        try:
            while True:
                if not self._queue:
                    if self._stopping:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await self._gather_group()
                group = self._take_group()
                await self._write_group(group)
                group = []
        except asyncio.CancelledError:
            raise
        except Exception as e:  # an I/O failure kills the journal: nothing more can be acknowledged
            self._fail(f"{type(e).__name__}: {e}", group)

    async def _gather_group(self) -> None:
        """Wait (bounded by group_wait_ms_max from the oldest record) for the group to fill."""
        if self._flush_when_idle or self._stopping:
            return
        deadline = self._queue[0].enqueued_ms + self._group_wait_ms_max
        while self._queued_bytes < self._group_bytes_max and not self._stopping:
            remaining_ms = deadline - self._clock.monotonic_ms()
            if remaining_ms <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining_ms / 1000.0)
            except TimeoutError:
                return

    def _take_group(self) -> list[_Pending]:
        group: list[_Pending] = []
        nbytes = 0
        while self._queue and (not group or nbytes + self._queue[0].nbytes <= self._group_bytes_max):
            pending = self._queue.popleft()
            group.append(pending)
            nbytes += pending.nbytes
            self._queued_records -= pending.nrecords
            self._queued_bytes -= pending.nbytes
        return group

    async def _write_group(self, group: list[_Pending]) -> None:
        chunks = [c for pending in group for c in pending.chunks]
        frame, records = fmt.framed_group_parts(chunks)  # framed: replay can tell a torn last group
        assert self._file is not None
        started_ms = self._clock.monotonic_ms()
        if self._sync_on_loop:
            self._file.write_synced_now(frame, records)  # blocks the loop for one sync; no thread hand-off
        else:
            await self._file.write_synced(frame, records)
        self._synced = JournalMark(self._file_id, self._file.size)
        if self._pages is not None:
            self._pages.synced(self._synced.offset)
        self.stats["groups"] += 1
        self.stats["records"] += sum(p.nrecords for p in group)
        self.stats["bytes"] += len(frame) + len(records)
        synced_ms = self._clock.monotonic_ms()
        self.sync_latency.observe(synced_ms - started_ms)
        add_latency = self.add_latency
        for pending in group:
            add_latency.observe(synced_ms - pending.enqueued_ms, pending.nrecords)
            if not pending.future.done():
                pending.future.set_result(None)
        if self._file.size >= self._file_bytes_max:
            await self._roll(self._file_id + 1)
        elif self._sync_on_loop:
            await asyncio.sleep(0)  # let the acknowledged adds answer before the next group is written

    async def _roll(self, new_id: int) -> None:
        """Close the current file and start `new_id`; its header and directory entry are durable first."""
        path = os.path.join(self._dir, fmt.journal_file_name(new_id))
        new_file = self._disk.create(path)
        await new_file.write_synced(fmt.encode_file_header(self._instance_id))
        await self._disk.sync_dir(self._dir)
        if self._file is not None:
            if self._pages is not None:
                self._pages.complete()  # every byte of it is synced
            self._file.close()
            self.stats["rolls"] += 1
        self._file, self._file_id = new_file, new_id
        self._pages = SyncedPages(new_file, CACHE_DROP_LAG_BYTES) if self._remove_from_page_cache else None
        self._synced = JournalMark(new_id, new_file.size)

    def _fail(self, why: str, in_flight: list[_Pending]) -> None:
        """The journal is dead: fail the group whose write or sync failed (its bytes may or may not be on the
        device: never acknowledged, so replay may keep or drop them) and everything queued behind it."""
        self._failure = why
        self._log(f"journal FAILED, no further adds can be acknowledged: {why}")
        error = BookieError(StatusCode.IO_ERROR, f"journal failed: {why}")
        while self._queue:
            in_flight.append(self._queue.popleft())
        for pending in in_flight:
            if not pending.future.done():
                pending.future.set_exception(error)
        self._queued_records = self._queued_bytes = 0
        if self._on_failure is not None:
            self._on_failure(why)
