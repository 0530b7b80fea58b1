"""Compaction of one entry log: the new log's file states, and what start-up does with each after a crash.

Compacting old log O into new log N (names in formats/entry_log.py; N is a fresh id above every log id on disk):

1. ``N-from-O.compacting``: the records of O that are still live (their ledger present, and the index still
   pointing at exactly that record of O) are appended, at most `compaction_rate_bytes_per_s`; the ledger map is
   appended and the header patched, so N is a sealed log. The index never points into this file.
   (How: `live_records` walks O's record headers; the index is read once per ledger over the entry-id range
   seen; consecutive live records are read from O and appended as one run of bytes, each record's length and ids
   checked in the run before it is appended.)
   Fault step ``compact_copy`` after the copy. A crash here: start-up deletes the file.
2. fsync N, rename it to ``N-from-O.compacted``, fsync the directory. Fault step ``compact_sync``.
   From here on reads resolve N through this name (EntryLogger alias) until step 5.
   A crash from here to step 5: start-up finishes the compaction (`recover`): it moves to N the location of
   every record of N whose index entry still names O (any part of the batch of step 3 may have landed: it is
   written in several store writes, bookie/index.py), deletes O unless a location still points into it (a compaction that kept O at step 3 leaves
   the same file), renames N to ``N.log``.
3. Under the engine's checkpoint lock (no checkpoint writes locations meanwhile): one synced index batch; each
   copied entry moves to N only if the index still points at its record in O (its encoded location, compared
   byte for byte; an entry re-added since, or a ledger deleted since, keeps what it has). Then a check that no
   live ledger of O still has a location in O; if one has, O is kept and N becomes an ordinary log. When the walk
   of step 1 reached O's end or its map, the check reads the index at the entries of the records it saw (an
   index entry naming O for any other entry names no record of it: its reads fail before O goes as after);
   when the walk stopped early on a damaged record, the whole index is read (records past the damage are
   unknown). Fault step ``compact_index``.
4. Delete O, fsync the directory. Fault step ``compact_delete``.
5. Rename N to ``N.log``, fsync the directory. Fault step ``compact_rename``.
6. Entry-log metadata: N's ledger map in, O's out, one synced batch. Fault step ``compact_meta``. A crash before
   it: start-up drops O's record (its file is gone) and reads N's map from N's header.

An I/O error (a full disk) or a stop before step 3 deletes the new file at once (the index never referenced
it); after step 3 a failure leaves the rest to start-up, exactly as a crash does.

So at every instant each live entry's location names a log that exists on disk, under ``<id>.log`` or (between
steps 2 and 5) under its ``.compacted`` name, and holds the entry's bytes.
"""
from __future__ import annotations

import asyncio
import os
import struct
from typing import Callable, Container

from bksim.bookie.entry_log import EntryLogger
from bksim.bookie.index import LocationIndex
from bksim.formats import entry_log as fmt
from bksim.formats import index as index_fmt
from bksim.formats.index import Location
from bksim.model.errors import FormatError
from bksim.ports.disk import Disk

COMPACTION_STEPS = ("compact_copy", "compact_sync", "compact_index", "compact_delete", "compact_rename",
                    "compact_meta")
_WRITE_STEP_BYTES = 1024 * 1024
# Step 1 reads the old log in chunks of this size and lets the event loop run after each one: adds wait at most
# one chunk's header walk (about a millisecond)
SCAN_CHUNK_BYTES = 1024 * 1024
# Live records are copied in runs (consecutive records, one read, one append): at most this many bytes per run, so
# a run's buffer and the pause of the event loop while it is checked stay small
RUN_BYTES_MAX = 1024 * 1024
_RECORD_BYTES_MAX = 1 << 30  # as EntryLogger.records: a length above this is damage, not an entry
_HEAD = struct.Struct(">Iqq")  # an entry record's length field and the entry's ledger and entry ids
assert _HEAD.size == fmt.LENGTH.size + fmt.ENTRY_IDS.size
_VALUE = index_fmt.LOCATION_VALUE.pack


async def live_records(disk: Disk, path: str, live: Container[int], outcome: dict
                       ) -> list[tuple[int, int, int, int]]:
    """(offset, ledger id, entry id, length) of every entry record of a sealed log whose ledger is in `live`, in file
    order: step 1's walk of the record headers (the bodies are not touched). Stops exactly where
    EntryLogger.records() stops (the ledger map, the end of the file, the first damaged or torn record) and sets
    `outcome["clean"]` as it does. Reads SCAN_CHUNK_BYTES at a time and yields to the event loop after each read."""
    out: list[tuple[int, int, int, int]] = []
    add = out.append
    unpack = _HEAD.unpack_from
    map_ids = (fmt.MAP_LEDGER_ID, fmt.MAP_ENTRY_ID)
    outcome["clean"] = False
    pos = start = fmt.HEADER_BYTES  # buf holds the file's bytes [start, start + len(buf))
    buf = b""
    while True:
        rel, end = pos - start, len(buf)
        while rel + _HEAD.size <= end:
            length, lid, eid = unpack(buf, rel)
            if length < fmt.ENTRY_IDS.size or length > _RECORD_BYTES_MAX:
                return out  # damage
            if rel + 4 + length > end:
                break  # the record continues in the next chunk
            if lid == map_ids[0] and eid == map_ids[1]:
                outcome["clean"] = True
                return out
            if lid in live:
                add((pos, lid, eid, length))
            pos += 4 + length
            rel += 4 + length
        buf, start = buf[rel:], pos
        need = _HEAD.size
        if len(buf) >= _HEAD.size:
            need = 4 + _HEAD.unpack_from(buf)[0]
        while len(buf) < need:
            more = disk.read(path, start + len(buf), max(SCAN_CHUNK_BYTES, need - len(buf)))
            if not more:
                outcome["clean"] = not buf  # the file ends exactly after a record; else a torn tail
                return out
            buf += more
        await asyncio.sleep(0)


async def copy_live(disk: Disk, path: str, log_id: int, live: Container[int], locations: LocationIndex,
                    writer: "CompactionWriter", throttle: Callable | None, outcome: dict
                    ) -> tuple[dict[int, list[tuple[int, bytes, bytes]]], dict[int, list[int]]]:
    """Step 1: append to `writer` the records of log `log_id` (at `path`) whose ledger is in `live` and at which the
    index points, in runs of consecutive records. Returns (ledger id -> [(entry id, its encoded location in the old
    log, in the new)], ledger id -> the entry ids of every record of it the walk saw) for step 3. `throttle(nbytes)` is awaited after each run. Raises FormatError if a record read
    back differs from what the header walk saw (the caller discards the new log)."""
    found = await live_records(disk, path, live, outcome)
    wanted: dict[int, list[int]] = {}
    for _offset, lid, eid, _length in found:
        ids = wanted.get(lid)
        if ids is None:
            wanted[lid] = ids = []
        ids.append(eid)
    current: dict[int, dict[int, bytes]] = {}
    for lid, eids in wanted.items():
        current[lid] = _current_locations(locations, lid, eids)
        await asyncio.sleep(0)
    copied: dict[int, list[tuple[int, bytes, bytes]]] = {}
    run: list[tuple[int, int, int, int, bytes]] = []
    run_start = run_end = -1
    for offset, lid, eid, length in found:
        old = _VALUE(log_id, offset, length)
        if current[lid].get(eid) != old:
            continue  # re-added elsewhere since, or its ledger deleted: this record is dead
        if offset != run_end or run_end - run_start >= RUN_BYTES_MAX:
            if run:
                await _copy_run(disk, path, writer, run, run_start, run_end, copied, throttle)
            run, run_start = [], offset
        run.append((offset, lid, eid, length, old))
        run_end = offset + 4 + length
    if run:
        await _copy_run(disk, path, writer, run, run_start, run_end, copied, throttle)
    return copied, wanted


def _current_locations(locations: LocationIndex, ledger_id: int, entry_ids: list[int]) -> dict[int, bytes]:
    """Entry id -> encoded location in the index now, for (at least) `entry_ids` of the ledger: one seek over their
    range, unless the range is much wider than the ids (then one read each)."""
    first, last = min(entry_ids), max(entry_ids)
    if last - first < 4 * len(entry_ids) + 1024:
        return locations.encoded_range(ledger_id, first, last)
    out = {}
    for eid in entry_ids:
        found = locations.get(ledger_id, eid)
        if found is not None:
            out[eid] = index_fmt.encode_location(found)
    return out


async def _copy_run(disk: Disk, path: str, writer: "CompactionWriter", run: list, run_start: int, run_end: int,
                    copied: dict, throttle: Callable | None) -> None:
    data = disk.read(path, run_start, run_end - run_start)
    if len(data) != run_end - run_start:
        raise FormatError(f"entry log {path}: {len(data)} bytes at {run_start}, expected {run_end - run_start}")
    for offset, lid, eid, length, _old in run:  # pair the walk's view with the bytes about to be copied
        if _HEAD.unpack_from(data, offset - run_start) != (length, lid, eid):
            raise FormatError(f"entry log {path}: the record at {offset} changed since it was read ({lid}:{eid})")
    at = writer.append_run(data, len(run)) - run_start
    new_log_id = writer.new_log_id
    ledger_bytes = writer.ledger_bytes
    for offset, lid, eid, length, old in run:
        moves = copied.get(lid)
        if moves is None:
            copied[lid] = moves = []
        moves.append((eid, old, _VALUE(new_log_id, at + offset, length)))
        ledger_bytes[lid] = ledger_bytes.get(lid, 0) + 4 + length
    await writer.write_out()
    if throttle is not None:
        await throttle(len(data))


async def index_moves(locations: LocationIndex, copied: dict[int, list[tuple[int, bytes, bytes]]]
                      ) -> list[tuple[bytes, bytes]]:
    """Step 3's batch: (location key, new location) of every copied entry whose index entry is still exactly its
    record in the old log. Call under the checkpoint lock, which every writer of locations holds (checkpoints,
    garbage collection's deletes), so the answer holds until the batch is written; the event loop runs between
    ledgers."""
    puts = []
    key = index_fmt.LOCATION_KEY.pack
    for lid, moves in copied.items():
        current = _current_locations(locations, lid, [eid for eid, _old, _new in moves])
        for eid, old, new in moves:
            if current.get(eid) == old:
                puts.append((key(lid, eid), new))
        await asyncio.sleep(0)
    return puts


async def ledgers_pointing_into(locations: LocationIndex, log_id: int, seen: dict[int, list[int]]) -> list[int]:
    """Step 3's last check after a walk that saw every record of log `log_id`: the ledgers whose index entries for
    the records seen (`seen`: ledger id -> entry ids, from copy_live) still name that log. After the batch nothing
    adds a location in a sealed log, so the event loop may run between ledgers."""
    prefix = index_fmt.LOG_META_KEY.pack(log_id)  # a location value starts with its log id, packed alike
    left = []
    for lid, eids in seen.items():
        if any(value[:4] == prefix for value in _current_locations(locations, lid, eids).values()):
            left.append(lid)
        await asyncio.sleep(0)
    return left


class CompactionWriter:
    """The new log of one compaction (steps 1-2 of the module docstring)."""

    def __init__(self, disk: Disk, directory: str, new_log_id: int, old_log_id: int) -> None:
        self._disk, self._dir = disk, directory
        self.new_log_id, self.old_log_id = new_log_id, old_log_id
        self.path = os.path.join(directory, fmt.compaction_file_name(new_log_id, old_log_id, fmt.COMPACTING))
        self._file = disk.create(self.path)
        self._file.write(fmt.encode_header())
        self._chunks: list[bytes] = []
        self._chunk_bytes = 0
        self._position = fmt.HEADER_BYTES
        self.ledger_bytes: dict[int, int] = {}
        self.entries = 0

    def append_run(self, records: bytes, entries: int) -> int:
        """Append a run of whole entry records (length field and entry each) as they are; returns the run's offset in
        the new log. The caller counts the run's bytes per ledger in `ledger_bytes` (the ledger map)."""
        offset = self._position
        self._chunks.append(records)
        self._position += len(records)
        self._chunk_bytes += len(records)
        self.entries += entries
        return offset

    async def write_out(self, force: bool = False) -> None:
        if self._chunks and (force or self._chunk_bytes >= _WRITE_STEP_BYTES):
            await self._file.write_chunks(self._chunks)
            self._chunks, self._chunk_bytes = [], 0

    async def seal(self, step: Callable[[str], None]) -> str:
        """Map, header, fsync, rename to `.compacted`, fsync the directory; returns the new path."""
        await self.write_out(force=True)
        self._file.write(fmt.encode_ledger_map(self.ledger_bytes))
        self._file.pwrite(0, fmt.encode_header(self._position, len(self.ledger_bytes)))
        step("compact_copy")
        await self._file.sync()
        self._file.close()
        compacted = os.path.join(self._dir, fmt.compaction_file_name(self.new_log_id, self.old_log_id,
                                                                     fmt.COMPACTED))
        self._disk.rename(self.path, compacted)
        await self._disk.sync_dir(self._dir)
        self.path = compacted
        step("compact_sync")
        return compacted

    def discard(self) -> None:
        """Give up before the index references the new log (any time up to step 3): close and delete it."""
        try:
            self._file.close()
        finally:
            if self._disk.exists(self.path):
                self._disk.remove(self.path)


async def recover(disk: Disk, logger: EntryLogger, locations: LocationIndex,
                  log: Callable[[str], None]) -> list[str]:
    """Start-up: delete `.compacting` files, finish every `.compacted` one (module docstring). Runs before the
    entry logger opens its new log and before replay. Returns what it did, one line per file."""
    done: list[str] = []
    for new_id, old_id, state, path in logger.compaction_files():
        if state == fmt.COMPACTING:
            disk.remove(path)
            await disk.sync_dir(logger.directory)
            done.append(f"deleted the unfinished compaction file {os.path.basename(path)}")
            continue
        puts = []
        for offset, ledger_id, entry_id, length, _entry in logger.records(path, lambda ledger_id: False):
            current = locations.get(ledger_id, entry_id)
            if current is not None and current.log_id == old_id:
                puts.append((index_fmt.location_key(ledger_id, entry_id),
                             index_fmt.encode_location(Location(new_id, offset, length))))
        if puts:
            await locations.put_batch(puts)
        old_path = os.path.join(logger.directory, fmt.entry_log_file_name(old_id))
        kept = locations.any_in_log(old_id)  # a compaction that kept its old log (step 3) crashed before step 5
        if disk.exists(old_path) and not kept:
            disk.remove(old_path)
        disk.rename(path, os.path.join(logger.directory, fmt.entry_log_file_name(new_id)))
        await disk.sync_dir(logger.directory)
        done.append(f"finished the compaction of entry log {old_id:x} into {new_id:x} ({len(puts)} locations moved"
                    + (", the old log kept: the index still points into it)" if kept else ")"))
    for line in done:
        log(f"start-up: {line}")
    return done
