"""SimKeyValueStore (ports.kv.KeyValueStore): ordered in-memory maps that behave like RocksDB on a crash.

Owns every simulated store of a run, by path, in a SimKvRegistry: the engine opens stores through
`registry.open_kv(path)` (its `open_kv` callable), so a process started after a crash re-opens the same
path and sees what survived.

The model (RocksDB with its write-ahead log):
- `write(puts, deletes, sync)` applies one batch atomically (all or nothing, also across a crash).
- sync=True: the batch, and every unsynced batch before it (the WAL is sequential), is durable when the
  call returns. sync=False: visible at once, lost on a crash, except that (seeded, with
  `unsynced_keep_probability`) a crash may keep a prefix of the unsynced batches, as RocksDB recovers a
  prefix of its WAL.
- `floor(key)` is a reverse seek (greatest key <= key); `items_from(key)` iterates from a snapshot taken
  when it is called, in key order.
- A crash ends the process: handles opened before it raise ProcessCrashed from then on.
- Latency: `write` sleeps a seeded latency in virtual time (it runs off the loop in production).

Must not: touch real files, use threads, or draw randomness from anything but the rng it is given.
"""
from __future__ import annotations

import asyncio
import bisect
import random
from dataclasses import dataclass
from typing import Iterator

from bksim.sim.disk import ProcessCrashed

_Batch = tuple[tuple[tuple[bytes, bytes], ...], tuple[bytes, ...]]


@dataclass(frozen=True, slots=True)
class KvFaults:
    latency_ms_min: float = 0.0
    latency_ms_max: float = 0.0
    unsynced_keep_probability: float = 0.0  # at a crash: keep a random prefix of the unsynced batches

    def __post_init__(self) -> None:
        assert 0.0 <= self.latency_ms_min <= self.latency_ms_max, self
        assert 0.0 <= self.unsynced_keep_probability <= 1.0, self


class _OrderedMap:
    __slots__ = ("values", "keys")

    def __init__(self, values: dict[bytes, bytes] | None = None) -> None:
        self.values: dict[bytes, bytes] = dict(values or {})
        self.keys: list[bytes] = sorted(self.values)

    def apply(self, batch: _Batch) -> None:
        puts, deletes = batch
        for key, value in puts:
            if key not in self.values:
                bisect.insort(self.keys, key)
            self.values[key] = value
        for key in deletes:
            if self.values.pop(key, None) is not None:
                del self.keys[bisect.bisect_left(self.keys, key)]


def _apply_to_dict(values: dict[bytes, bytes], batch: _Batch) -> None:
    puts, deletes = batch
    for key, value in puts:
        values[key] = value
    for key in deletes:
        values.pop(key, None)


class _StoreData:
    """One store's current map, durable map and unsynced batches."""

    def __init__(self) -> None:
        self.current = _OrderedMap()
        self.durable: dict[bytes, bytes] = {}
        self.unsynced: list[_Batch] = []


class SimKvRegistry:
    """Every simulated key-value store of a run, by path, and their crash."""

    def __init__(self, faults: KvFaults | None = None, rng: random.Random | None = None) -> None:
        self.faults = faults or KvFaults()
        self.rng = rng or random.Random(0)
        self.generation = 0
        self._stores: dict[str, _StoreData] = {}

    def open_kv(self, path: str) -> "SimKeyValueStore":
        """The engine's `open_kv`: a handle on the store at `path` (created empty on first open)."""
        data = self._stores.get(path)
        if data is None:
            data = self._stores[path] = _StoreData()
        return SimKeyValueStore(self, data, path)

    def crash(self, rng: random.Random) -> list[str]:
        """Power loss: every store goes back to its durable content (plus a seeded prefix of unsynced
        batches). Kills every open handle. Returns one line per store that lost writes, for the trace."""
        self.generation += 1
        lost = []
        for path in sorted(self._stores):
            data = self._stores[path]
            kept = 0
            if data.unsynced and self.faults.unsynced_keep_probability > 0 and \
                    rng.random() < self.faults.unsynced_keep_probability:
                kept = rng.randrange(len(data.unsynced) + 1)
            if data.unsynced:
                lost.append(f"{path}: {len(data.unsynced)} unsynced batches, {kept} kept")
            durable = _OrderedMap(data.durable)
            for batch in data.unsynced[:kept]:
                durable.apply(batch)
            data.current = durable
            data.durable = dict(durable.values)
            data.unsynced = []
        return lost

    def durable_get(self, path: str, key: bytes) -> bytes | None:
        """What a crash now would leave under `key` (checkers; not part of the port)."""
        data = self._stores.get(path)
        return data.durable.get(key) if data is not None else None


class SimKeyValueStore:
    """ports.kv.KeyValueStore: one process's handle on one simulated store."""

    def __init__(self, registry: SimKvRegistry, data: _StoreData, path: str) -> None:
        self.path = path
        self._registry, self._data = registry, data
        self._generation = registry.generation
        self._closed = False

    def _check(self) -> _StoreData:
        if self._generation != self._registry.generation:
            raise ProcessCrashed(f"key-value store {self.path}: handle of a crashed process")
        if self._closed:
            raise ValueError(f"key-value store {self.path} is closed")
        return self._data

    def get(self, key: bytes) -> bytes | None:
        return self._check().current.values.get(key)

    def floor(self, key: bytes) -> tuple[bytes, bytes] | None:
        current = self._check().current
        i = bisect.bisect_right(current.keys, key)
        if i == 0:
            return None
        found = current.keys[i - 1]
        return found, current.values[found]

    def items_from(self, key: bytes) -> Iterator[tuple[bytes, bytes]]:
        current = self._check().current
        start = bisect.bisect_left(current.keys, key)
        snapshot = [(k, current.values[k]) for k in current.keys[start:]]
        return iter(snapshot)

    async def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes], sync: bool) -> None:
        if not puts and not deletes:
            return
        batch: _Batch = (tuple((bytes(k), bytes(v)) for k, v in puts), tuple(bytes(k) for k in deletes))
        self._check()
        f = self._registry.faults
        await asyncio.sleep(self._registry.rng.uniform(f.latency_ms_min, f.latency_ms_max) / 1000.0)
        data = self._check()  # maybe: the process crashed meanwhile; the batch never reached the WAL
        data.current.apply(batch)
        data.unsynced.append(batch)
        if sync:
            for unsynced in data.unsynced:
                _apply_to_dict(data.durable, unsynced)
            data.unsynced = []

    def close(self) -> None:
        self._closed = True
