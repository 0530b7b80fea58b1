"""The engine's list_entries (ListEntries, BookKeeper's GET_LIST_OF_ENTRIES_OF_LEDGER) over real files and
RocksDB: the ids held in the write cache (both halves), the location index and what replay put back, as sorted,
disjoint, non-adjacent ranges; the statuses (NO_LEDGER, OK with none, UNKNOWN_STATE in limbo, BAD_REQUEST); the
pages and their bounds (ids per answer, ranges that fit in frame_bytes_max), with the index read lazily."""
from __future__ import annotations

import asyncio
import dataclasses

from bksim.adapters.clock import SystemClock
from bksim.adapters.localdisk import LocalDisk
from bksim.adapters.rocks import open_rocks
from bksim.bookie.engine import BookieEngine
from bksim.bookie.requests import RANGE_BYTES_MAX, RESPONSE_OVERHEAD, list_all_entries, list_ranges_max
from bksim.formats.index import ENTRY_ID_MAX
from bksim.gen import bookie_pb2
from bksim.model.config import BookieConfig
from bksim.model.status import FLAG_RECOVERY_ADD, StatusCode as S

from .conftest import KEY, entry


def run(coro):
    return asyncio.run(coro)


async def add(e: BookieEngine, ledger_id: int, entry_ids, flags: int = 0) -> None:
    statuses, message = await e.add_entries([(entry(ledger_id, i), KEY, flags) for i in entry_ids])
    assert statuses == [S.OK] * len(entry_ids), message


async def listed(e: BookieEngine, ledger_id: int, **bounds) -> tuple[S, list[tuple[int, int]]]:
    """Every page of the engine's answer, joined as a transport joins them."""
    async def page(first_entry: int):
        status, ranges, next_entry, _message = await e.list_entries(ledger_id, first_entry, **bounds)
        return status, ranges, next_entry
    return await list_all_entries("engine", ledger_id, page)


def test_entries_in_the_write_cache_only(engines):
    async def scenario():
        e = await engines.started()
        await add(e, 1, [0, 1, 2, 3, 7, 8])
        assert e.statistics()["write_cache_bytes"] > 0  # not checkpointed: nothing of ledger 1 is indexed yet
        assert e._locations.last_entry_id(1) == -1
        assert await e.list_entries(1) == (S.OK, [(0, 3), (7, 8)], -1, "")
        await e.close()
    run(scenario())


def test_entries_after_a_checkpoint_and_across_cache_and_index(engines):
    async def scenario():
        e = await engines.started()
        await add(e, 1, [0, 1, 2, 5])
        await e.checkpoint()
        assert e.statistics()["write_cache_bytes"] == 0 and e._locations.last_entry_id(1) == 5
        assert await e.list_entries(1) == (S.OK, [(0, 2), (5, 5)], -1, "")
        await add(e, 1, [3, 5, 6, 9])  # 3 and 6 extend indexed runs; 5 is in the cache and the index
        assert await e.list_entries(1) == (S.OK, [(0, 3), (5, 6), (9, 9)], -1, "")
        await add(e, 1, [4])  # joins two runs
        assert await e.list_entries(1) == (S.OK, [(0, 6), (9, 9)], -1, "")
        await add(e, 2, [0])  # neighbours do not leak in
        await add(e, 0, [4])
        await e.checkpoint()
        assert await e.list_entries(1) == (S.OK, [(0, 6), (9, 9)], -1, "")
        assert await e.list_entries(1, 5) == (S.OK, [(5, 6), (9, 9)], -1, "")  # from an entry on
        assert await e.list_entries(1, 10) == (S.OK, [], -1, "")
        await e.close()
    run(scenario())


def test_a_gap_and_a_striped_replica(engines):
    async def scenario():
        e = await engines.started()
        # bookie 0 of an E=3 Qw=2 ensemble holds entries e with e % 3 in (0, 2)
        held = [i for i in range(29) if i % 3 != 1]
        await add(e, 3, held)
        await e.checkpoint()
        await add(e, 3, [40, 41])
        assert await e.list_entries(3) == (S.OK, [(0, 0)] + [(i, i + 1) for i in range(2, 29, 3)] + [(40, 41)], -1,
                                           "")
        await e.close()
    run(scenario())


def test_replay_puts_back_what_a_crash_lost_from_the_cache(engines):
    async def scenario():
        e = await engines.started()
        await add(e, 1, [0, 1])
        await e.checkpoint()
        await add(e, 1, [2, 3, 6])  # journaled, only in the write cache
        e.abandon()
        e = await engines.started()
        assert await e.list_entries(1) == (S.OK, [(0, 3), (6, 6)], -1, "")
        await e.close()
        e = await engines.started()  # a clean restart too
        assert await e.list_entries(1) == (S.OK, [(0, 3), (6, 6)], -1, "")
        await e.close()
    run(scenario())


def test_unknown_ledger_empty_ledger_and_bad_ids(engines):
    async def scenario():
        e = await engines.started()
        assert await e.list_entries(5) == (S.NO_LEDGER, [], -1, "ledger 5 not on this bookie")
        assert (await e.read_entry(6, -1, fence=True, master_key=KEY))[0] == S.NO_ENTRY
        assert await e.list_entries(6) == (S.OK, [], -1, "")  # fenced, so known, without entries
        assert (await e.list_entries(-1))[0] == S.BAD_REQUEST
        assert (await e.list_entries(6, -1))[0] == S.BAD_REQUEST
        e.abandon()
        e = await engines.started()  # the fence came back from the journal
        assert await e.list_entries(6) == (S.OK, [], -1, "")
        assert (await e.list_entries(5))[0] == S.NO_LEDGER
        await add(e, 6, [2], FLAG_RECOVERY_ADD)
        assert await e.list_entries(6) == (S.OK, [(2, 2)], -1, "")
        await e.close()
        assert (await e.list_entries(6))[0] == S.IO_ERROR  # closed
    run(scenario())


def test_a_ledger_in_limbo_is_unknown_whatever_it_holds(engines):
    async def scenario():
        limbo_max = 10
        e = BookieEngine(BookieConfig(), disk=LocalDisk(), clock=SystemClock(), open_kv=open_rocks,
                         instance_id=engines.instance_id, journal_dir=engines.journal_dir,
                         ledger_dir=engines.ledger_dir, log=engines.logs.append, limbo_ledger_id_max=limbo_max)
        await e.start()
        await add(e, 7, [0, 1], FLAG_RECOVERY_ADD)  # copied back after the format: the rest may be gone
        for ledger_id in (0, 7, limbo_max):
            status, ranges, _next, message = await e.list_entries(ledger_id)
            assert (status, ranges) == (S.UNKNOWN_STATE, []), ledger_id
            assert f"ledger {ledger_id} is in limbo (id <= {limbo_max}" in message
        assert (await e.list_entries(limbo_max + 1))[0] == S.NO_LEDGER  # created after the format
        await add(e, limbo_max + 1, [0])
        assert await e.list_entries(limbo_max + 1) == (S.OK, [(0, 0)], -1, "")
        await e.close()
    run(scenario())


def test_pages_bound_the_ids_and_the_ranges_and_join_again(engines):
    async def scenario():
        e = await engines.started()
        await add(e, 1, list(range(10)) + [12, 14, 15, 20])
        await e.checkpoint()
        await add(e, 1, [16, 22])  # the cache takes part in the pages too
        assert await e.list_entries(1, ids_max=4) == (S.OK, [(0, 3)], 4, "")
        assert await e.list_entries(1, 4, ids_max=4) == (S.OK, [(4, 7)], 8, "")
        assert await e.list_entries(1, 8, ids_max=4) == (S.OK, [(8, 9), (12, 12), (14, 14)], 15, "")
        assert await e.list_entries(1, ranges_max=2) == (S.OK, [(0, 9), (12, 12)], 14, "")
        assert await e.list_entries(1, 14, ranges_max=2) == (S.OK, [(14, 16), (20, 20)], 22, "")
        whole = [(0, 9), (12, 12), (14, 16), (20, 20), (22, 22)]
        assert await e.list_entries(1) == (S.OK, whole, -1, "")
        for bounds in ({"ids_max": 1}, {"ids_max": 3}, {"ranges_max": 1}, {"ids_max": 2, "ranges_max": 1}):
            assert await listed(e, 1, **bounds) == (S.OK, whole), bounds
        await e.close()
    run(scenario())


def test_a_page_reads_only_the_keys_it_answers(engines):
    """A ledger with many indexed entries: one page reads at most ids_max + 1 keys of the index."""
    reads = []

    class CountingStore:
        def __init__(self, store) -> None:
            self._store = store

        def __getattr__(self, name):
            return getattr(self._store, name)

        def items_from(self, key):
            for item in self._store.items_from(key):
                reads.append(item[0])
                yield item

    async def scenario():
        e = BookieEngine(BookieConfig(), disk=LocalDisk(), clock=SystemClock(),
                         open_kv=lambda path: CountingStore(open_rocks(path)), instance_id=engines.instance_id,
                         journal_dir=engines.journal_dir, ledger_dir=engines.ledger_dir, log=engines.logs.append)
        await e.start()
        for start in range(0, 4000, 1000):
            await add(e, 1, range(start, start + 1000))
        await add(e, 2, [0])
        await e.checkpoint()
        reads.clear()
        assert await e.list_entries(1, 100, ids_max=50) == (S.OK, [(100, 149)], 150, "")
        assert len(reads) <= 51
        reads.clear()
        assert await e.list_entries(1) == (S.OK, [(0, 3999)], -1, "")
        assert len(reads) == 4001  # the ledger's keys and the next ledger's first, which ends the scan
        await e.close()
    run(scenario())


def test_the_frame_bound_holds_the_largest_ranges():
    config = dataclasses.replace(BookieConfig(), frame_bytes_max=64 * 1024)
    n = list_ranges_max(config)
    assert n == (64 * 1024 - RESPONSE_OVERHEAD) // RANGE_BYTES_MAX
    big = ENTRY_ID_MAX - 2 * n  # the longest varints
    answer = bookie_pb2.ListEntriesResponse(status=S.OK, next_entry=ENTRY_ID_MAX, ranges=[
        bookie_pb2.EntryRange(first=big + 2 * i, last=big + 2 * i + 1) for i in range(n)])
    assert answer.ByteSize() <= config.frame_bytes_max
    assert list_ranges_max(BookieConfig()) > BookieConfig().list_entries_ids_max  # by default ids bound a page


def test_the_engine_pages_by_its_frame_bound(engines):
    async def scenario():
        e = await engines.started(frame_bytes_max=RESPONSE_OVERHEAD + 3 * RANGE_BYTES_MAX)
        await add(e, 1, [0, 2, 4, 6, 8])
        assert await e.list_entries(1) == (S.OK, [(0, 0), (2, 2), (4, 4)], 6, "")
        assert await e.list_entries(1, 6) == (S.OK, [(6, 6), (8, 8)], -1, "")
        await e.close()
    run(scenario())
