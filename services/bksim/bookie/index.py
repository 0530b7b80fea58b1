"""The bookie's two indexes over an ordered key-value store (RocksDB in production).

LocationIndex: (ledger, entry) -> Location in an entry log. Written once per checkpoint, synced. A large batch
goes to the store in writes of at most BATCH_KEYS_MAX keys, only the last synced (the store's write-ahead log
is sequential, so its sync covers the writes before): rocksdict holds the GIL for a whole write, and one write
of 16,000 keys froze the bookie's event loop for ~11 ms. So a batch is not atomic: a crash may keep any prefix
of it, and each caller's recovery works key by key (a checkpoint's by journal replay, compaction's by
`compaction.recover`, a deletion by the next garbage collection round).
LedgerIndex: ledger -> LedgerRecord (master key, fenced, explicit LAC). Held in memory (loaded at start);
changes are persisted at checkpoint step 6. Durability of fences and keys between checkpoints comes from
the journal (FENCE / MASTER_KEY records are replayed), not from this store. `remove` (garbage collection)
drops a ledger in memory at once and from the store at the next flush, unless it was written again before.
LogMetaIndex: entry log id -> {ledger id: bytes} of sealed logs (formats/index.py "entrylogs"), all in memory.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

from bksim.formats import index as fmt
from bksim.ports.kv import KeyValueStore


BATCH_KEYS_MAX = 1024  # keys per store write (~0.7 ms in RocksDB's memtable, holding the GIL)


class LocationIndex:
    def __init__(self, store: KeyValueStore) -> None:
        self._store = store

    def get(self, ledger_id: int, entry_id: int) -> fmt.Location | None:
        value = self._store.get(fmt.location_key(ledger_id, entry_id))
        return fmt.decode_location(value) if value is not None else None

    def last_entry_id(self, ledger_id: int) -> int:
        """Highest indexed entry id of the ledger (a reverse seek), or -1."""
        found = self._store.floor(fmt.location_key(ledger_id, fmt.ENTRY_ID_MAX))
        if found is None:
            return -1
        lid, eid = fmt.decode_location_key(found[0])
        return eid if lid == ledger_id else -1

    def entry_ids(self, ledger_id: int, first_entry: int = 0) -> Iterator[int]:
        """The ledger's indexed entry ids >= `first_entry`, ascending, read lazily from one seek (a ledger may
        have millions: stop early, and close the iterator). Raises FormatError on a malformed key."""
        items = self._store.items_from(fmt.location_key(ledger_id, first_entry))
        try:
            for key, _value in items:
                lid, eid = fmt.decode_location_key(key)
                if lid != ledger_id:
                    return
                yield eid
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # a generator over a RocksDB iterator: release it now

    def ledger_ids(self) -> list[int]:
        """Every ledger with a location, ascending: one seek per ledger, not a read of every entry."""
        out: list[int] = []
        key = b""
        while True:
            items = self._store.items_from(key)
            try:
                first = next(iter(items), None)
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    close()
            if first is None:
                return out
            ledger_id = fmt.decode_location_key(first[0])[0]
            out.append(ledger_id)
            key = fmt.location_key(ledger_id + 1, 0)

    async def put_batch(self, items: list[tuple[bytes, bytes]]) -> None:
        """Write encoded (location key, location value) pairs, durable when it returns (module docstring)."""
        for at in range(0, len(items), BATCH_KEYS_MAX):
            await self._store.write(items[at:at + BATCH_KEYS_MAX], [], sync=at + BATCH_KEYS_MAX >= len(items))

    def keys_of(self, ledger_id: int) -> list[bytes]:
        """Every location key of the ledger (garbage collection deletes them in one batch)."""
        out: list[bytes] = []
        items = self._store.items_from(fmt.location_key(ledger_id, 0))
        try:
            for key, _value in items:
                if fmt.decode_location_key(key)[0] != ledger_id:
                    break
                out.append(key)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        return out

    def encoded_range(self, ledger_id: int, first_entry: int, last_entry: int) -> dict[int, bytes]:
        """Entry id -> encoded location of the ledger's indexed entries in [first_entry, last_entry], read from one
        seek (compaction compares them byte for byte with the locations it expects)."""
        out: dict[int, bytes] = {}
        unpack = fmt.LOCATION_KEY.unpack
        items = self._store.items_from(fmt.location_key(ledger_id, first_entry))
        try:
            for key, value in items:
                lid, eid = unpack(key)
                if lid != ledger_id or eid > last_entry:
                    break
                out[eid] = value
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
        return out

    def any_in_log(self, log_id: int) -> bool:
        """Whether any location at all is in entry log `log_id` (a scan of the whole index: only for logs whose
        ledgers are not all known)."""
        items = self._store.items_from(b"")
        try:
            return any(fmt.decode_location(value).log_id == log_id for _key, value in items)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    async def delete_batch(self, keys: list[bytes]) -> None:
        """Delete location keys, durable when it returns (module docstring)."""
        for at in range(0, len(keys), BATCH_KEYS_MAX):
            await self._store.write([], keys[at:at + BATCH_KEYS_MAX], sync=at + BATCH_KEYS_MAX >= len(keys))

    def close(self) -> None:
        self._store.close()


class LedgerIndex:
    def __init__(self, store: KeyValueStore) -> None:
        self._store = store
        self._ledgers: dict[int, fmt.LedgerRecord] = {}
        self._dirty: set[int] = set()
        self._removed: set[int] = set()  # removed in memory, not yet from the store
        for key, value in store.items_from(b""):
            self._ledgers[fmt.decode_ledger_key(key)] = fmt.decode_ledger(value)

    def get(self, ledger_id: int) -> fmt.LedgerRecord | None:
        return self._ledgers.get(ledger_id)

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def __len__(self) -> int:
        return len(self._ledgers)

    def ledger_ids(self) -> list[int]:
        return sorted(self._ledgers)

    def put(self, ledger_id: int, record: fmt.LedgerRecord) -> None:
        self._ledgers[ledger_id] = record
        self._dirty.add(ledger_id)
        self._removed.discard(ledger_id)

    def remove(self, ledger_id: int) -> None:
        """Forget the ledger now; the next flush deletes its record (unless it is put again before)."""
        if self._ledgers.pop(ledger_id, None) is not None:
            self._dirty.discard(ledger_id)
            self._removed.add(ledger_id)

    def update(self, ledger_id: int, **changes) -> fmt.LedgerRecord:
        record = dataclasses.replace(self._ledgers.get(ledger_id) or fmt.LedgerRecord(), **changes)
        self.put(ledger_id, record)
        return record

    async def flush(self) -> None:
        """Persist every change since the last flush in one synced batch (checkpoint step 6)."""
        dirty, self._dirty = self._dirty, set()
        removed, self._removed = self._removed, set()
        puts = [(fmt.ledger_key(lid), fmt.encode_ledger(self._ledgers[lid])) for lid in sorted(dirty)]
        try:
            await self._store.write(puts, [fmt.ledger_key(lid) for lid in sorted(removed)], sync=True)
        except BaseException:
            self._dirty |= dirty
            self._removed |= {lid for lid in removed if lid not in self._ledgers}
            raise

    def close(self) -> None:
        self._store.close()


class LogMetaIndex:
    """Entry-log metadata of sealed logs: log id -> {ledger id: bytes}. Loaded at start, written through."""

    def __init__(self, store: KeyValueStore) -> None:
        self._store = store
        self._logs: dict[int, dict[int, int]] = {}
        for key, value in store.items_from(b""):
            self._logs[fmt.decode_log_meta_key(key)] = fmt.decode_log_meta(value)

    def get(self, log_id: int) -> dict[int, int] | None:
        return self._logs.get(log_id)

    def log_ids(self) -> list[int]:
        return sorted(self._logs)

    def items(self) -> list[tuple[int, dict[int, int]]]:
        return sorted(self._logs.items())

    async def write(self, puts: dict[int, dict[int, int]], deletes: list[int]) -> None:
        """Record sealed logs and forget deleted ones, in one synced batch."""
        await self._store.write([(fmt.log_meta_key(i), fmt.encode_log_meta(m)) for i, m in sorted(puts.items())],
                                [fmt.log_meta_key(i) for i in deletes], sync=True)
        for i in deletes:
            self._logs.pop(i, None)
        self._logs.update(puts)

    def close(self) -> None:
        self._store.close()
