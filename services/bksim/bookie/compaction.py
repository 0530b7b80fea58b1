"""Compaction of one entry log: the new log's file states, and what start-up does with each after a crash.

Compacting old log O into new log N (names in formats/entry_log.py; N is a fresh id above every log id on disk):

1. ``N-from-O.compacting``: the records of O that are still live (their ledger present, and the index still
   pointing at exactly that record of O) are appended, at most `compaction_rate_bytes_per_s`; the ledger map is
   appended and the header patched, so N is a sealed log. The index never points into this file.
   Fault step ``compact_copy`` after the copy. A crash here: start-up deletes the file.
2. fsync N, rename it to ``N-from-O.compacted``, fsync the directory. Fault step ``compact_sync``.
   From here on reads resolve N through this name (EntryLogger alias) until step 5.
   A crash from here to step 5: start-up finishes the compaction (`recover`): it moves to N the location of
   every record of N whose index entry still names O (the batch of step 3 is atomic: all or nothing of it may
   have landed), deletes O, renames N to ``N.log``.
3. Under the engine's checkpoint lock (no checkpoint writes locations meanwhile): one synced index batch; each
   copied entry moves to N only if the index still points at its record in O (an entry re-added since, or a
   ledger deleted since, keeps what it has). Then a check that no live ledger of O still has a location in O;
   if one has (O's scan stopped early on a damaged record), O is kept and N becomes an ordinary log.
   Fault step ``compact_index``.
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

import os
from typing import Callable

from bksim.bookie.entry_log import EntryLogger
from bksim.bookie.index import LocationIndex
from bksim.formats import entry_log as fmt
from bksim.formats import index as index_fmt
from bksim.formats.index import Location
from bksim.ports.disk import Disk

COMPACTION_STEPS = ("compact_copy", "compact_sync", "compact_index", "compact_delete", "compact_rename",
                    "compact_meta")
_WRITE_STEP_BYTES = 1024 * 1024


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

    def append(self, ledger_id: int, entry: bytes) -> Location:
        size = len(entry)
        self._chunks.append(fmt.LENGTH.pack(size))
        self._chunks.append(entry)
        location = Location(self.new_log_id, self._position, size)
        self._position += 4 + size
        self._chunk_bytes += 4 + size
        self.ledger_bytes[ledger_id] = self.ledger_bytes.get(ledger_id, 0) + 4 + size
        self.entries += 1
        return location

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
        if disk.exists(old_path):
            disk.remove(old_path)
        disk.rename(path, os.path.join(logger.directory, fmt.entry_log_file_name(new_id)))
        await disk.sync_dir(logger.directory)
        done.append(f"finished the compaction of entry log {old_id:x} into {new_id:x} ({len(puts)} locations moved)")
    for line in done:
        log(f"start-up: {line}")
    return done
