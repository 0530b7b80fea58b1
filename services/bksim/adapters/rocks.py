"""RocksDB through rocksdict in raw mode (ports.kv.KeyValueStore). `open_rocks_read_only` opens an existing store
without taking its lock (tools that read a running bookie's index: `bksim entrylog dump`); writes through it fail."""
from __future__ import annotations

import asyncio
import os
from typing import Iterator

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch, WriteOptions


class RocksStore:
    def __init__(self, path: str, read_only: bool = False) -> None:
        if not read_only:
            os.makedirs(path, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(not read_only)
        self._db = Rdict(path, options, access_type=AccessType.read_only() if read_only else AccessType.read_write())
        self._sync = WriteOptions()
        self._sync.sync = True
        self._nosync = WriteOptions()
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
        self._db.write(batch, self._sync if sync else self._nosync)

    async def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes], sync: bool) -> None:
        if puts or deletes:
            await asyncio.to_thread(self._write, puts, deletes, sync)

    def close(self) -> None:
        self._db.close()


def open_rocks(path: str) -> RocksStore:
    return RocksStore(path)


def open_rocks_read_only(path: str) -> RocksStore:
    """An existing store, read only (no lock: the bookie may be running); an exception if there is none."""
    return RocksStore(path, read_only=True)
