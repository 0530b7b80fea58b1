"""bookie/index.py over the REAL RocksDB adapter (rocksdict in a tmp dir): reverse seeks for the last entry
of a ledger among neighbouring ledgers, synced batches that survive a reopen, and the ledger index."""
from __future__ import annotations

import asyncio

import pytest

from bksim.adapters.rocks import open_rocks
from bksim.bookie.index import LedgerIndex, LocationIndex
from bksim.formats.index import ENTRY_ID_MAX, LedgerRecord, Location, encode_location, location_key


def loc(n: int) -> Location:
    n %= 1 << 20
    return Location(log_id=1, offset=64 + 100 * n, length=36 + n)


def put(index: LocationIndex, pairs) -> None:
    asyncio.run(index.put_batch([(location_key(lid, eid), encode_location(loc(eid))) for lid, eid in pairs]))


@pytest.fixture
def locations(tmp_path):
    index = LocationIndex(open_rocks(str(tmp_path / "locations")))
    yield index
    index.close()


def test_empty_store(locations):
    assert locations.last_entry_id(0) == -1 and locations.last_entry_id(5) == -1
    assert locations.get(5, 0) is None


def test_last_entry_id_reverse_seek_across_neighbours(locations):
    put(locations, [(4, 0), (4, 1), (4, 2), (6, 0), (6, 9), (6, 10)])
    assert locations.last_entry_id(5) == -1  # empty between two ledgers that have entries
    assert locations.last_entry_id(4) == 2
    assert locations.last_entry_id(6) == 10  # 10 > 9 numerically and as BE bytes
    assert locations.last_entry_id(3) == -1 and locations.last_entry_id(7) == -1
    put(locations, [(5, 3)])
    assert [locations.last_entry_id(i) for i in (4, 5, 6)] == [2, 3, 10]
    assert locations.get(5, 3) == loc(3) and locations.get(5, 2) is None


def test_last_entry_id_at_the_id_extremes(locations):
    put(locations, [(0, 0), (1, ENTRY_ID_MAX), (2, 255), (2, 256)])
    assert locations.last_entry_id(0) == 0
    assert locations.last_entry_id(1) == ENTRY_ID_MAX
    assert locations.last_entry_id(2) == 256  # not 255: compared as integers, not as low bytes


def test_put_batch_persists_across_reopen(tmp_path):
    path = str(tmp_path / "locations")
    index = LocationIndex(open_rocks(path))
    put(index, [(9, eid) for eid in range(50)])
    put(index, [(9, 3)] + [(8, 1)])  # a re-put of the same key replaces
    index.close()
    index = LocationIndex(open_rocks(path))
    try:
        assert index.last_entry_id(9) == 49 and index.last_entry_id(8) == 1
        assert all(index.get(9, eid) == loc(eid) for eid in range(50))
    finally:
        index.close()


def test_ledger_index_flush_and_reload(tmp_path):
    path = str(tmp_path / "ledgers")
    ledgers = LedgerIndex(open_rocks(path))
    assert len(ledgers) == 0 and ledgers.get(1) is None and 1 not in ledgers
    ledgers.put(3, LedgerRecord(master_key=b"k3"))
    ledgers.update(1, master_key=b"k1")
    ledgers.update(1, fenced=True)
    ledgers.update(2, explicit_lac=4)  # a record can exist without a key (e.g. created by replay)
    assert ledgers.get(1) == LedgerRecord(b"k1", True, None)
    asyncio.run(ledgers.flush())
    ledgers.update(3, explicit_lac=8)  # changed after the flush: not persisted until the next one
    ledgers.close()

    ledgers = LedgerIndex(open_rocks(path))
    assert ledgers.ledger_ids() == [1, 2, 3] and len(ledgers) == 3
    assert ledgers.get(1) == LedgerRecord(b"k1", True, None)
    assert ledgers.get(2) == LedgerRecord(b"", False, 4)
    assert ledgers.get(3) == LedgerRecord(b"k3", False, None)
    ledgers.update(3, explicit_lac=8)
    asyncio.run(ledgers.flush())
    asyncio.run(ledgers.flush())  # nothing dirty: a no-op
    ledgers.close()

    ledgers = LedgerIndex(open_rocks(path))
    try:
        assert ledgers.get(3) == LedgerRecord(b"k3", False, 8)
    finally:
        ledgers.close()


def test_ledger_index_keeps_dirty_set_when_the_write_fails(tmp_path):
    class FailingStore:
        def __init__(self, inner):
            self.inner, self.fail = inner, True

        def items_from(self, key):
            return self.inner.items_from(key)

        async def write(self, puts, deletes, sync):
            if self.fail:
                raise OSError("disk on fire")
            await self.inner.write(puts, deletes, sync)

        def close(self):
            self.inner.close()

    store = FailingStore(open_rocks(str(tmp_path / "ledgers")))
    ledgers = LedgerIndex(store)
    ledgers.update(1, master_key=b"k")
    with pytest.raises(OSError):
        asyncio.run(ledgers.flush())
    store.fail = False
    asyncio.run(ledgers.flush())  # the change that failed is retried
    ledgers.close()
    ledgers = LedgerIndex(open_rocks(str(tmp_path / "ledgers")))
    try:
        assert ledgers.get(1) == LedgerRecord(b"k")
    finally:
        ledgers.close()
