"""SimKeyValueStore's crash model (bksim.sim.kv): synced batches survive, unsynced ones are lost (or a
prefix kept, like RocksDB's WAL), batches are atomic, handles die with their process; ordered reads."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.sim.disk import ProcessCrashed
from bksim.sim.kv import KvFaults, SimKvRegistry
from bksim.sim.loop import run


def test_synced_writes_survive_a_crash_and_unsynced_ones_do_not():
    async def main():
        registry = SimKvRegistry()
        store = registry.open_kv("/kv")
        await store.write([(b"a", b"1")], [], sync=True)
        await store.write([(b"b", b"2")], [b"a"], sync=False)
        before = (store.get(b"a"), store.get(b"b"))
        registry.crash(random.Random(0))
        again = registry.open_kv("/kv")
        return before, (again.get(b"a"), again.get(b"b"))
    assert run(main()) == ((None, b"2"), (b"1", None))


def test_a_synced_write_makes_earlier_unsynced_writes_durable():
    async def main():
        registry = SimKvRegistry()
        store = registry.open_kv("/kv")
        await store.write([(b"a", b"1")], [], sync=False)
        await store.write([(b"b", b"2")], [], sync=True)
        registry.crash(random.Random(0))
        again = registry.open_kv("/kv")
        return again.get(b"a"), again.get(b"b")
    assert run(main()) == (b"1", b"2")


def test_a_crash_may_keep_a_prefix_of_the_unsynced_batches():
    async def main():
        kept = set()
        for seed in range(30):
            registry = SimKvRegistry(KvFaults(unsynced_keep_probability=1.0))
            store = registry.open_kv("/kv")
            for key in (b"a", b"b", b"c"):
                await store.write([(key, b"v")], [], sync=False)
            registry.crash(random.Random(seed))
            kept.add(tuple(k for k, _ in registry.open_kv("/kv").items_from(b"")))
        return kept
    assert run(main()) == {(), (b"a",), (b"a", b"b"), (b"a", b"b", b"c")}  # prefixes only, never (b"b",)


def test_a_batch_interrupted_by_a_crash_is_not_applied():
    async def main():
        registry = SimKvRegistry(KvFaults(latency_ms_min=1.0, latency_ms_max=1.0))
        store = registry.open_kv("/kv")
        task = asyncio.get_running_loop().create_task(store.write([(b"a", b"1"), (b"b", b"2")], [], sync=True))
        await asyncio.sleep(0.0005)  # virtual time: crash exactly while the synced write is in flight
        registry.crash(random.Random(0))
        with pytest.raises(ProcessCrashed):
            await task
        return list(registry.open_kv("/kv").items_from(b""))
    assert run(main()) == []


def test_handles_opened_before_a_crash_are_dead():
    async def main():
        registry = SimKvRegistry()
        store = registry.open_kv("/kv")
        registry.crash(random.Random(0))
        with pytest.raises(ProcessCrashed):
            store.get(b"a")
        with pytest.raises(ProcessCrashed):
            await store.write([(b"a", b"1")], [], sync=True)
        store2 = registry.open_kv("/kv")
        store2.close()
        with pytest.raises(ValueError):
            store2.get(b"a")
        return True
    assert run(main())


def test_floor_and_items_from_are_ordered_like_rocksdb():
    async def main():
        store = SimKvRegistry().open_kv("/kv")
        await store.write([(b"\x01\x05", b"a"), (b"\x01\x01", b"b"), (b"\x02\x00", b"c")], [], sync=True)
        snapshot = store.items_from(b"\x01\x02")
        await store.write([(b"\x01\x03", b"late")], [b"\x02\x00"], sync=True)
        return (store.floor(b"\x01\xff"), store.floor(b"\x01\x00"), store.floor(b"\xff"), list(snapshot),
                list(store.items_from(b"")))
    floor_in, floor_none, floor_last, snapshot, everything = run(main())
    assert floor_in == (b"\x01\x05", b"a") and floor_none is None and floor_last == (b"\x01\x05", b"a")
    assert snapshot == [(b"\x01\x05", b"a"), (b"\x02\x00", b"c")]  # taken when items_from was called
    assert everything == [(b"\x01\x01", b"b"), (b"\x01\x03", b"late"), (b"\x01\x05", b"a")]
