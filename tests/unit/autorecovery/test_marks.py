"""UnderReplicationMarks (autorecovery/marks.py) over the in-memory metadata store: merging, CAS conflicts,
lock exclusivity and session loss, removal only of the mark read, the disable switch."""
from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from bksim.autorecovery.marks import (MARK_CAS_ATTEMPTS_MAX, Mark, UnderReplicationMarks, decode_mark, encode_mark,
                                      void_lost_on)
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import (UNDERREPLICATED_LEDGERS, UNDERREPLICATION_DISABLE, underreplicated_path,
                                  underreplication_lock_path)
from bksim.model.errors import BadVersionError
from fakes.clock import WALL_EPOCH_MS, ManualClock


def run(coro):
    return asyncio.run(coro)


def world():
    store = InMemoryMetadataStore()
    clock = ManualClock()
    return store, clock, UnderReplicationMarks(store.session("auditor"), clock)


def test_a_mark_is_created_at_its_hex_path_and_read_back():
    async def main():
        store, clock, marks = world()
        clock.advance(1234)
        created = await marks.mark(16, ["b2", "b1", "b2"])
        assert created == Mark(16, ("b1", "b2"), WALL_EPOCH_MS + 1234, version=0)
        data, version = await store.get("/ledgers/underreplication/ledgers/0000/0000/0000/0010/urL0000000016")
        assert version == 0 and json.loads(data)["missing"] == ["b1", "b2"]
        assert await marks.get(16) == created
        assert await marks.get(17) is None
    run(main())


def test_marking_again_merges_the_bookies_and_keeps_the_ctime():
    async def main():
        store, clock, marks = world()
        first = await marks.mark(5, ["b1"])
        clock.advance(500)
        merged = await marks.mark(5, ["b3"])
        assert merged.missing == ("b1", "b3") and merged.version == 1 and merged.ctime_ms == first.ctime_ms
        same = await marks.mark(5, ["b3", "b1"])  # nothing new: no write
        assert same == merged and store.stat(underreplicated_path(5)).version == 1
    run(main())


class InterleavingStore:
    """A session whose next `set` first lets another writer change the node (a lost CAS)."""

    def __init__(self, inner, before_set):
        self._inner = inner
        self._before_set = before_set

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def set(self, path, data, version):
        hook, self._before_set = self._before_set, None
        if hook is not None:
            await hook()
        return await self._inner.set(path, data, version)


def test_a_lost_cas_is_re_read_and_merged_never_overwritten():
    async def main():
        store, clock, marks = world()
        await marks.mark(7, ["b1"])
        other = UnderReplicationMarks(store.session("decommission"), clock)

        async def concurrent_mark():
            await other.mark(7, ["b9"])

        racing = UnderReplicationMarks(InterleavingStore(store.session("auditor-2"), concurrent_mark), clock)
        result = await racing.mark(7, ["b2"])
        assert result.missing == ("b1", "b2", "b9") and result.version == 2
        assert (await marks.get(7)).missing == ("b1", "b2", "b9")
    run(main())


def test_a_mark_deleted_between_read_and_write_is_created_again():
    async def main():
        store, clock, marks = world()
        await marks.mark(8, ["b1"])

        async def remove():
            await marks.replicated(await marks.get(8))

        racing = UnderReplicationMarks(InterleavingStore(store.session("auditor-2"), remove), clock)
        result = await racing.mark(8, ["b2"])
        assert result.missing == ("b2",) and result.version == 0
    run(main())


def test_endless_conflicts_end_in_bad_version_after_the_bound():
    async def main():
        store, clock, marks = world()
        await marks.mark(9, ["b1"])

        class AlwaysRacing(InterleavingStore):
            async def set(self, path, data, version):
                data, _ = await store.get(path)
                await store.set(path, data, -1)  # a rival write before every CAS of ours
                return await self._inner.set(path, data, version)

        racing = UnderReplicationMarks(AlwaysRacing(store.session("x"), None), clock)
        with pytest.raises(BadVersionError):
            await racing.mark(9, ["b2"])
        assert store.stat(underreplicated_path(9)).version == MARK_CAS_ATTEMPTS_MAX  # one rival write per round
        assert (await marks.get(9)).missing == ("b1",)
    run(main())


def test_a_lock_is_exclusive_and_released_only_by_its_taker():
    async def main():
        store, clock, _ = world()
        a = UnderReplicationMarks(store.session("worker-a"), clock)
        b = UnderReplicationMarks(store.session("worker-b"), clock)
        assert await a.claim(3, "worker-a")
        assert not await b.claim(3, "worker-b")
        assert not await a.claim(3, "worker-a")  # held, also by ourselves
        assert await a.lock_owner(3) == "worker-a" and await b.lock_owner(3) == "worker-a"
        await b.release(3)  # not b's lock
        assert await b.lock_owner(3) == "worker-a"
        assert a.held() == [3]
        await a.release(3)
        assert await a.lock_owner(3) is None and a.held() == []
        assert await b.claim(3, "worker-b")
        await a.release(3)  # released already: nothing
        assert await b.lock_owner(3) == "worker-b"
    run(main())


def test_a_lock_dies_with_its_session_and_the_old_owner_cannot_release_the_new_lock():
    async def main():
        store, clock, _ = world()
        session_a = store.session("worker-a")
        a = UnderReplicationMarks(session_a, clock)
        b = UnderReplicationMarks(store.session("worker-b"), clock)
        assert await a.claim(4, "worker-a")
        assert store.expire(session_a) == [underreplication_lock_path(4)]
        assert await b.lock_owner(4) is None
        assert await b.claim(4, "worker-b")
        await a.release(4)  # its session is gone: nothing to release, no error
        assert await b.lock_owner(4) == "worker-b"
    run(main())


def test_a_lock_that_changed_hands_is_not_deleted():
    async def main():
        store, clock, _ = world()
        a = UnderReplicationMarks(store.session("worker-a"), clock)
        assert await a.claim(6, "worker-a")
        await store.delete(underreplication_lock_path(6))  # e.g. an operator removed it
        b = UnderReplicationMarks(store.session("worker-b"), clock)
        assert await b.claim(6, "worker-b")
        await a.release(6)
        assert await b.lock_owner(6) == "worker-b"
    run(main())


def test_replicated_refuses_a_mark_that_was_re_marked_meanwhile():
    async def main():
        store, clock, marks = world()
        read = await marks.mark(16, ["b1"])
        await marks.mark(16, ["b2"])  # a second bookie went during the copy
        assert not await marks.replicated(read)
        current = await marks.get(16)
        assert current.missing == ("b1", "b2")
        assert await marks.replicated(current)
        assert await marks.get(16) is None
        assert await marks.replicated(current)  # gone already: done
        assert await store.children(UNDERREPLICATED_LEDGERS) == []  # the empty hex directories went too
    run(main())


def test_replicated_keeps_the_directories_other_marks_live_in():
    async def main():
        store, clock, marks = world()
        one, two = await marks.mark(1, ["b1"]), await marks.mark(2, ["b1"])
        assert await marks.replicated(one)
        assert [m.ledger_id for m in await marks.list()] == [2]
        assert await marks.replicated(two)
        assert await marks.list() == []
    run(main())


def test_list_walks_the_hierarchy_in_id_order_and_skips_strangers():
    async def main():
        store, clock, marks = world()
        ids = [2**40 + 5, 0, 70_000, 16, 2**63 - 1]
        for ledger_id in ids:
            await marks.mark(ledger_id, [f"b{ledger_id % 3}"])
        await store.create(f"{UNDERREPLICATED_LEDGERS}/0000/0000/0000/0010/junk", make_parents=True)
        await store.create(f"{UNDERREPLICATED_LEDGERS}/zzzz", make_parents=True)
        listed = await marks.list()
        assert [m.ledger_id for m in listed] == sorted(ids)
        assert all(m.missing == (f"b{m.ledger_id % 3}",) for m in listed)
        assert [m.ledger_id for m in await marks.list(limit=2)] == sorted(ids)[:2]
    run(main())


def test_set_lost_is_a_cas_and_survives_a_merge():
    async def main():
        store, clock, marks = world()
        read = await marks.mark(11, ["b1"])
        lost = await marks.set_lost(read, 3, "entries 4..6 have no replica")
        assert (lost.lost_entries, lost.note, lost.version) == (3, "entries 4..6 have no replica", 1)
        assert await marks.get(11) == lost
        with pytest.raises(BadVersionError):
            await marks.set_lost(read, 5, "stale")  # read before the last write: re-read, re-decide
        merged = await marks.mark(11, ["b2"])
        assert (merged.missing, merged.lost_entries, merged.note) == (("b1", "b2"), 3, lost.note)
    run(main())


def test_a_lost_verdict_keeps_the_bookies_it_rested_on_and_is_withdrawn_only_once_one_is_registered():
    async def main():
        store, clock, marks = world()
        read = await marks.mark(11, ["b1", "b2"])
        assert read.lost_on == ()
        lost = await marks.set_lost(read, 3, "entries 4..6: no copy", lost_on=["b2", "b1", "b2"])
        assert lost.lost_on == ("b1", "b2") and await marks.get(11) == lost
        assert void_lost_on(lost, ["b3"]) == [] and void_lost_on(lost, ["b3", "b2"]) == ["b2"]
        assert await marks.withdraw_void_lost(lost, ["b3"]) == (lost, [])  # they all stay away: it holds
        merged = await marks.mark(11, ["b3"])  # changed since `lost` was read: judged again on the mark now
        assert merged.lost_on == ("b1", "b2")
        stored, back = await marks.withdraw_void_lost(lost, ["b1"])
        assert back == ["b1"] and stored == await marks.get(11)
        assert (stored.missing, stored.lost_entries, stored.note, stored.lost_on) == (("b1", "b2", "b3"), 0, "", ())
        answered = await marks.set_lost(stored, 2, "entries 1, 2: every replica answered NO_ENTRY")
        assert void_lost_on(answered, ["b1", "b2", "b3"]) == []  # rests on answers, not on silence
        assert await marks.withdraw_void_lost(answered, ["b1"]) == (answered, [])
    run(main())


def test_a_mark_written_without_lost_on_decodes_with_none():
    doc = {"format_version": 1, "missing": ["b1"], "ctime_ms": 5, "lost_entries": 2, "note": "n"}
    mark = decode_mark(3, json.dumps(doc).encode(), 4)
    assert (mark.missing, mark.lost_entries, mark.lost_on, mark.version) == (("b1",), 2, (), 4)
    assert decode_mark(3, encode_mark(dataclasses.replace(mark, lost_on=("b1",))), 4).lost_on == ("b1",)


def test_undecodable_mark_data_still_marks_the_ledger_and_is_replaced_by_the_next_mark():
    async def main():
        store, clock, marks = world()
        await store.create(underreplicated_path(12), b"\xffnot json", make_parents=True)
        bad = await marks.get(12)
        assert bad.missing == () and "undecodable" in bad.note and bad.version == 0
        good = await marks.mark(12, ["b4"])
        assert (good.missing, good.note, good.version) == (("b4",), "", 1)
    run(main())


def test_disable_and_enable_are_idempotent():
    async def main():
        store, clock, marks = world()
        assert not await marks.is_disabled()
        await marks.disable()
        await marks.disable()
        assert await marks.is_disabled() and await store.exists(UNDERREPLICATION_DISABLE) is not None
        await marks.enable()
        await marks.enable()
        assert not await marks.is_disabled()
    run(main())
