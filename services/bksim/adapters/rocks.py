"""RocksDB through rocksdict in raw mode (ports.kv.KeyValueStore). `open_rocks_read_only` opens an existing store
without taking its lock (tools that read a running bookie's index: `bksim entrylog dump`); writes through it fail.

A synced write is a write without sync (RocksDB appends the batch to its write-ahead log and hands it to the OS
before it returns), then an fdatasync of the log's files (RocksDB's own SyncWAL does the same). rocksdict holds
the GIL for the whole of a write, so a write with `sync=True` froze every thread of the process (a bookie's event
loop with it) for the fsync: 10-40 ms for an index batch; `os.fdatasync` releases it."""
from __future__ import annotations

import asyncio
import functools
import os
from typing import Callable, Iterator

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch, WriteOptions


WRITE_BUFFER_BYTES = 16 * 1024 * 1024  # memtable size (bookie.index_write_buffer_bytes); RocksDB's own default is 64 MB


class RocksStore:
    def __init__(self, path: str, read_only: bool = False, write_buffer_bytes: int = WRITE_BUFFER_BYTES) -> None:
        if not read_only:
            os.makedirs(path, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(not read_only)
        options.set_write_buffer_size(write_buffer_bytes)
        self._db = Rdict(path, options, access_type=AccessType.read_only() if read_only else AccessType.read_write())
        self._nosync = WriteOptions()
        self._wal_synced: set[str] = set()  # the log files present at the last synced write
        self.path = path

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def floor(self, key: bytes) -> tuple[bytes, bytes] | None:
        it = self._db.iter(ReadOptions())
        try:
            it.seek_for_prev(key)
            if it.valid():
                return it.key(), it.value()
            return None
        finally:
            del it

    def items_from(self, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter(ReadOptions())
        try:
            it.seek(key)
            while it.valid():
                yield it.key(), it.value()
                it.next()
        finally:
            del it

    def _write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes], sync: bool) -> None:
        batch = WriteBatch(raw_mode=True)
        for k, v in puts:
            batch.put(k, v)
        for k in deletes:
            batch.delete(k)
        self._db.write(batch, self._nosync)
        if sync:
            self._sync_wal()

    def _sync_wal(self) -> None:
        """fdatasync every write-ahead log file of the store (`<number>.log` in its directory, RocksDB's default
        wal_dir): the one just written, and an older one RocksDB may not have synced when it switched logs; and
        the directory when a log file appeared since the last time (RocksDB syncs it only on a synced write)."""
        names = {name for name in os.listdir(self.path) if name.endswith(".log") and name[:-4].isdigit()}
        for name in sorted(names):
            try:
                _fdatasync(os.path.join(self.path, name), os.O_RDONLY)
            except FileNotFoundError:
                names.discard(name)  # obsolete, deleted meanwhile: its records are in a table file already
        if not names <= self._wal_synced:
            _fdatasync(self.path, os.O_RDONLY | os.O_DIRECTORY, os.fsync)
        self._wal_synced = names

    async def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes], sync: bool) -> None:
        if puts or deletes:
            await asyncio.to_thread(self._write, puts, deletes, sync)

    def close(self) -> None:
        self._db.close()


def open_rocks(path: str, write_buffer_bytes: int = WRITE_BUFFER_BYTES) -> RocksStore:
    return RocksStore(path, write_buffer_bytes=write_buffer_bytes)


def index_opener(write_buffer_bytes: int) -> Callable[[str], RocksStore]:
    """A BookieEngine's `open_kv`: its index stores with memtables of `write_buffer_bytes`
    (bookie.index_write_buffer_bytes)."""
    return functools.partial(open_rocks, write_buffer_bytes=write_buffer_bytes)


def open_rocks_read_only(path: str) -> RocksStore:
    """An existing store, read only (no lock: the bookie may be running); an exception if there is none."""
    return RocksStore(path, read_only=True)


def _fdatasync(path: str, flags: int, sync=None) -> None:
    fd = os.open(path, flags)
    try:
        (sync or os.fdatasync)(fd)
    finally:
        os.close(fd)
