"""Entry logs: where checkpointed entries live (PROTOCOL.md §2.2 "Entry logs").

Owns the files `<ledger_dir>/entrylogs/<hex id>.log`. Each start-up opens a fresh log; a log rolls at
`bytes_max`: its ledger map (ledger id -> bytes) is appended and the header patched, so GC/compaction can
learn a log's ledgers without scanning it. Appends are not durable until `flush()` (checkpoint step 4).

Log ids are never reused: a new id is above every id on disk, including the ids of compaction files
(formats/entry_log.py), and above the current log. `take_sealed()` hands the maps of logs rolled since the
last call to the engine, which records them (entry-log metadata, bookie/index.py LogMetaIndex) after the
flush that synced them. A log made by compaction is readable under its `.compacted` name while the index
may already point at it and the rename to `<id>.log` has not happened (`alias`).

Reads are synchronous (index lookup and file read with no await between, engine.py `_get`), so deleting a
log between the two steps of a read cannot happen on the event loop: garbage collection and compaction
delete a log only after the index no longer points into it.
"""
from __future__ import annotations

import asyncio

import os
from typing import Callable, Iterable, Iterator

from bksim.bookie.page_cache import SyncedPages
from bksim.formats import entry_log as fmt
from bksim.formats import index as index_fmt
from bksim.formats.index import Location
from bksim.model.errors import FormatError
from bksim.ports.disk import AppendFile, Disk


_LENGTH = fmt.LENGTH.pack
_KEY = index_fmt.LOCATION_KEY.pack
# A checkpoint writes and fsyncs the entry log in steps of this many bytes: the event loop runs between steps,
# and the journal's small syncs never queue behind one large flush of the device (bookie-add p99 27 -> 18 ms).
_STEP_BYTES = 1024 * 1024
_VALUE = index_fmt.LOCATION_VALUE.pack
_SCAN_CHUNK_BYTES = 1024 * 1024
_NOTHING = (lambda ledger_id: False)  # noqa: E731 - records(): lengths only
_RECORD_BYTES_MAX = 1 << 30  # a length above this is damage, not an entry (entry_bytes_max is far below)


class EntryLogger:
    def __init__(self, disk: Disk, directory: str, bytes_max: int, page_cache_bytes: int = -1) -> None:
        """`page_cache_bytes` >= 0: as a checkpoint's steps and flush sync the current log, its synced bytes older
        than its newest `page_cache_bytes` leave the OS page cache, and a rolled log's all once the flush synced it
        (bookie/page_cache.py); reads of them then come from the device, through the engine's read cache. -1: the
        page cache keeps them all."""
        self._disk, self._dir, self._bytes_max = disk, directory, bytes_max
        self._page_cache_bytes = page_cache_bytes
        self._pages: SyncedPages | None = None  # the current log's, when its pages leave the page cache
        self._file: AppendFile | None = None
        self._log_id = 0
        self._ledger_bytes: dict[int, int] = {}
        # rolled logs awaiting the next flush's fsync, each with its SyncedPages (None: its pages stay cached)
        self._unsynced: list[tuple[AppendFile, SyncedPages | None]] = []
        self._sealed: list[tuple[int, dict[int, int]]] = []  # rolled logs whose map the engine has not taken
        self._aliases: dict[int, str] = {}  # log id -> path of a compacted log not yet renamed to <id>.log

    @property
    def directory(self) -> str:
        return self._dir

    def log_ids(self) -> list[int]:
        ids = (fmt.parse_entry_log_file_name(n) for n in self._disk.list_dir(self._dir))
        return sorted(i for i in ids if i is not None)

    def compaction_files(self) -> list[tuple[int, int, str, str]]:
        """(new log id, old log id, state, path) of every compaction file in the directory."""
        out = []
        for name in self._disk.list_dir(self._dir):
            parsed = fmt.parse_compaction_file_name(name)
            if parsed is not None:
                out.append((*parsed, os.path.join(self._dir, name)))
        return sorted(out)

    def next_log_id(self) -> int:
        """An id above every log id on disk (compaction files included) and the current log's."""
        taken = self.log_ids() + [new for new, _old, _state, _path in self.compaction_files()]
        return max(taken + [self._log_id]) + 1

    def path(self, log_id: int) -> str:
        alias = self._aliases.get(log_id)
        return alias if alias is not None else os.path.join(self._dir, fmt.entry_log_file_name(log_id))

    def set_alias(self, log_id: int, path: str | None) -> None:
        if path is None:
            self._aliases.pop(log_id, None)
        else:
            self._aliases[log_id] = path

    async def open(self) -> None:
        self._disk.makedirs(self._dir)
        await self._start_log(self.next_log_id())

    async def _start_log(self, log_id: int) -> None:
        new_file = self._disk.create(self.path(log_id))
        new_file.write(fmt.encode_header())
        await new_file.sync()
        await self._disk.sync_dir(self._dir)
        self._file, self._log_id, self._ledger_bytes = new_file, log_id, {}
        self._pages = SyncedPages(new_file, self._page_cache_bytes) if self._page_cache_bytes >= 0 else None

    @property
    def current_log_id(self) -> int:
        return self._log_id

    def current_ledger_bytes(self) -> dict[int, int]:
        """Ledger id -> bytes appended to the log being written (its map so far, in memory)."""
        return dict(self._ledger_bytes)

    def take_sealed(self) -> list[tuple[int, dict[int, int]]]:
        """Logs rolled since the last call, with their ledger maps (durable after the next flush)."""
        sealed, self._sealed = self._sealed, []
        return sealed

    def ledger_map(self, log_id: int) -> dict[int, int] | None:
        """The ledger map a sealed log carries, or None if it has none (not rolled cleanly) or it is damaged."""
        path = self.path(log_id)
        try:
            header = fmt.decode_header(self._disk.read(path, 0, fmt.HEADER_BYTES))
            if header.ledger_map_offset < fmt.HEADER_BYTES:
                return None
            length = fmt.decode_map_length(self._disk.read(path, header.ledger_map_offset, 4), header.ledger_map_offset)
            body = self._disk.read(path, header.ledger_map_offset + 4, length)
            found = fmt.decode_ledger_map(body)
        except (OSError, FormatError, ValueError):
            return None
        return found if len(found) == header.ledger_count else None

    def records(self, path: str, wanted: Callable[[int], bool] | None = None, outcome: dict | None = None
                ) -> Iterator[tuple[int, int, int, int, bytes | None]]:
        """(offset, ledger id, entry id, entry length, entry bytes) of every entry record of a log, in file order,
        read in chunks; the bytes only for ledgers `wanted` accepts (all when None), else None. Stops at the ledger
        map, the end of the file, or the first damaged record: a torn tail of a log that was being written when
        the bookie stopped, or damage in the middle, which a scan cannot tell apart; `outcome["clean"]` says
        whether it stopped at the map or exactly at the end of the file."""
        pos = fmt.HEADER_BYTES
        buf = b""
        start = pos  # buf holds the file's bytes [start, start + len(buf))

        def have(n: int) -> bool:
            nonlocal buf, start
            if pos + n <= start + len(buf):
                return True
            buf, start = buf[pos - start:], pos
            while len(buf) < n:
                more = self._disk.read(path, start + len(buf), max(_SCAN_CHUNK_BYTES, n - len(buf)))
                if not more:
                    return False
                buf += more
            return True

        if outcome is not None:
            outcome["clean"] = False
        while have(4):
            (length,) = fmt.LENGTH.unpack_from(buf, pos - start)
            if length < fmt.ENTRY_IDS.size or length > _RECORD_BYTES_MAX or not have(4 + length):
                return
            at = pos - start + 4
            lid, eid = fmt.ENTRY_IDS.unpack_from(buf, at)
            if (lid, eid) == (fmt.MAP_LEDGER_ID, fmt.MAP_ENTRY_ID):
                break
            yield pos, lid, eid, length, buf[at:at + length] if wanted is None or wanted(lid) else None
            pos += 4 + length
        else:
            if pos != start + len(buf):
                return  # a partial length field at the end
        if outcome is not None:
            outcome["clean"] = True

    def scan_ledger_bytes(self, log_id: int) -> dict[int, int]:
        """Ledger id -> bytes of a log without a usable map, by reading it through. A scan that stopped before
        the end adds index_fmt.UNKNOWN_LEDGER (0 bytes): records past the stop may hold ledgers it did not see,
        so this log is deleted only after a check of the whole index (engine: delete_dead_logs, compact_log)."""
        out: dict[int, int] = {}
        outcome: dict = {}
        try:
            for _offset, lid, _eid, length, _entry in self.records(self.path(log_id), _NOTHING, outcome):
                out[lid] = out.get(lid, 0) + 4 + length
        except OSError:
            outcome["clean"] = False
        if not outcome.get("clean"):
            out[index_fmt.UNKNOWN_LEDGER] = 0
        return out

    async def remove(self, log_id: int) -> None:
        """Delete a sealed log (never the current one) and make the removal durable."""
        assert log_id != self._log_id, "the log being written is never deleted"
        path = self.path(log_id)
        if self._disk.exists(path):
            await self._disk.delete(path)
            await self._disk.sync_dir(self._dir)
        self._aliases.pop(log_id, None)

    async def append_sorted(self, runs: list[tuple[int, Iterable[tuple[int, bytes]]]]) -> list[tuple[bytes, bytes]]:
        """Append per-ledger runs of entries (ledgers ascending, entries ascending within a run); return the
        encoded (index key, location) pairs. Durable when flush() returns (checkpoint step 4).

        Hot at checkpoints: per entry two packs and three appends. Every _STEP_BYTES the step's records are
        written and synced off the event loop in one hand-off, while the loop encodes the next step (at most one
        step in flight: the device never holds more than two steps of unsynced entry-log bytes).
        """
        out: list[tuple[bytes, bytes]] = []
        add = out.append
        chunk: list[bytes] = []
        put = chunk.append
        assert self._file is not None
        position = self._file.size
        step_end = position + _STEP_BYTES
        bytes_max = self._bytes_max
        log_id = self._log_id
        writing: asyncio.Future | None = None  # the previous step's write + sync, off the loop
        writing_end = 0  # the file's size once that step is written

        async def previous_step_done() -> None:
            nonlocal writing
            if writing is not None:
                step, writing = writing, None
                await step
                if self._pages is not None:
                    self._pages.synced(writing_end)  # a step at a time: no one long call on the loop

        try:
            for ledger_id, entries in runs:
                run_start = position
                for entry_id, entry in entries:
                    size = len(entry)
                    if position + 4 + size > bytes_max and position > fmt.HEADER_BYTES:
                        self._count_run(ledger_id, position - run_start)
                        await previous_step_done()
                        await self._file.write_chunks(chunk)
                        chunk = []
                        put = chunk.append
                        await self._roll()
                        position = run_start = self._file.size
                        step_end = position + _STEP_BYTES
                        log_id = self._log_id
                    put(_LENGTH(size))
                    put(entry)
                    add((_KEY(ledger_id, entry_id), _VALUE(log_id, position, size)))
                    position += 4 + size
                    if position >= step_end:
                        await previous_step_done()
                        writing = asyncio.ensure_future(self._file.write_chunks_synced(chunk))
                        writing_end = position
                        chunk = []
                        put = chunk.append
                        step_end = position + _STEP_BYTES
                self._count_run(ledger_id, position - run_start)
            await previous_step_done()
            if chunk:
                await self._file.write_chunks(chunk)
        finally:
            if writing is not None:  # failed or cancelled meanwhile: nothing writes this file until that step ends
                await asyncio.wait([writing])
                if not writing.cancelled():
                    writing.exception()  # retrieved: the error that matters is the one propagating
        return out

    def _count_run(self, ledger_id: int, nbytes: int) -> None:
        if nbytes:
            self._ledger_bytes[ledger_id] = self._ledger_bytes.get(ledger_id, 0) + nbytes

    async def _roll(self) -> None:
        """Seal the current log with its ledger map and start the next one."""
        assert self._file is not None
        map_offset = self._file.size
        self._file.write(fmt.encode_ledger_map(self._ledger_bytes))
        self._file.pwrite(0, fmt.encode_header(map_offset, len(self._ledger_bytes)))
        self._unsynced.append((self._file, self._pages))
        self._sealed.append((self._log_id, dict(self._ledger_bytes)))
        # maybe: an earlier roll failed after creating its file; never reuse an id that exists on disk
        await self._start_log(self.next_log_id())

    async def seal_current(self) -> tuple[int, dict[int, int]]:
        """Clean shutdown: give the log being written its ledger map and sync it (nothing is appended after),
        so the next start need not scan it. Returns (log id, map)."""
        assert self._file is not None
        map_offset = self._file.size
        self._file.write(fmt.encode_ledger_map(self._ledger_bytes))
        self._file.pwrite(0, fmt.encode_header(map_offset, len(self._ledger_bytes)))
        await self.flush()
        return self._log_id, dict(self._ledger_bytes)

    async def flush(self) -> None:
        """fsync every log appended to since the last flush (checkpoint step 4)."""
        for rolled, pages in self._unsynced:
            await rolled.sync()
            if pages is not None:
                pages.complete()
            rolled.close()
        self._unsynced.clear()
        if self._file is not None:
            await self._file.sync()
            if self._pages is not None:
                self._pages.synced(self._file.size)

    def read(self, location: Location, ledger_id: int, entry_id: int) -> bytes:
        """The entry at `location`, checked against the expected ids. Raises FormatError if missing/damaged."""
        path = self.path(location.log_id)
        try:
            record = self._disk.read(path, location.offset, 4 + location.length)
        except OSError as e:
            raise FormatError(f"entry log {path} unreadable for {ledger_id}:{entry_id}: {e}") from None
        return fmt.check_record(record, ledger_id, entry_id, location.length)

    def close(self) -> None:
        for f, _pages in self._unsynced:
            f.close()
        self._unsynced.clear()
        if self._file is not None:
            self._file.close()
            self._file = None
