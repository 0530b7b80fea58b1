"""ManagedCursor over the in-memory metadata store, FakeBookies (an in-memory fake of the bookie transport) behind
real LedgerServices (one per "broker", each its own metadata session) and a FakeLayout: persistence to the cursor
ledger, recovery (with recovery-open) after a kill, fall-backs to the znode, chunking, rolling, fencing."""
from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace

import pytest

from bksim.broker.ledgers import LedgerService
from bksim.topics import cursor_codec as codec
from bksim.topics.errors import TopicError
from bksim.topics.managed_cursor import CURSOR_PASSWORD, ManagedCursor
from bksim.topics.positions import Position as P
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.model.config import BrokerConfig, TopicConfig
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus, StatusCode, TopicStatus
from helpers import wait_until_async
from fakes.bookies import FakeBookies
from fakes.layout import FakeLayout
from fakes.clock import ManualClock
from fakes.lossy_store import LossyStore

ML = "/managed-ledgers/t/ns/persistent/topic"
PATH = f"{ML}/sub"
CONFIG = TopicConfig(cursor_persist_interval_ms=1000)


class World:
    def __init__(self, bookies=("b0", "b1", "b2", "b3"), layout=None) -> None:
        self.store = InMemoryMetadataStore()
        self.bookie_ids = list(bookies)
        self.fake = FakeBookies(self.bookie_ids)
        self.layout = layout or FakeLayout([(100, 1000), (101, 0), (102, 500)])
        self.clock = ManualClock()
        self.logs: list[str] = []
        self.brokers = 0

    async def start(self) -> "World":
        reg = self.store.session("bookies")
        self.registration = reg
        for b in self.bookie_ids:
            await reg.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
        await self.store.create(ML, b"{}", make_parents=True)
        return self

    def broker(self) -> LedgerService:
        self.brokers += 1
        return LedgerService(store=self.store.session(f"broker-{self.brokers}"), transport=self.fake,
                             rng=random.Random(self.brokers), clock=self.clock, config=BrokerConfig(),
                             log=self.logs.append)

    async def open(self, service: LedgerService, config=CONFIG, **kw) -> ManagedCursor:
        kw.setdefault("background_flush", False)
        return await ManagedCursor.open(name="sub", path=PATH, layout=self.layout, ledgers=service,
                                        store=service.store, clock=self.clock, config=config, log=self.logs.append,
                                        **kw)

    async def znode(self) -> dict:
        data, _ = await self.store.get(PATH)
        return json.loads(data)


def run(coro):
    return asyncio.run(coro)


async def world(**kw) -> World:
    return await World(**kw).start()


def holes_pattern(cursor: ManagedCursor) -> list[P]:
    """Every other entry of ledger 100 from 1, and a few in 102."""
    acked = [P(100, e) for e in range(1, 1000, 2)] + [P(102, 7), P(102, 8), P(102, 300)]
    cursor.ack(acked)
    return acked


def assert_same_state(a: ManagedCursor, b: ManagedCursor) -> None:
    assert b.mark_delete == a.mark_delete
    assert list(b.state.ranges()) == list(a.state.ranges())
    assert list(b.state.batches()) == list(a.state.batches())
    assert list(b.state.redeliveries()) == list(a.state.redeliveries())
    assert b.properties == a.properties


# ---------------------------------------------------------------------------------------------- open
def test_open_creates_the_znode_at_latest_or_earliest():
    async def main():
        w = await world()
        svc = w.broker()
        latest = await w.open(svc)
        assert latest.mark_delete == P(102, 499) and latest.backlog() == 0
        assert (await w.znode())["mark_delete"] == [102, 499]
        assert latest.stats_internal()["recovery"]["source"] == "new"
        await w.store.delete(PATH)
        earliest = await w.open(svc, initial_position="earliest")
        assert earliest.mark_delete == P(100, -1) and earliest.read_position == P(100, 0)
        assert earliest.backlog() == 1500
        z = await w.znode()
        assert z["cursor_ledger"] == -1 and z["mark_delete"] == [100, -1]
        with pytest.raises(TopicError) as info:
            await w.open(svc, initial_position="middle")
        assert info.value.status is TopicStatus.BAD_REQUEST
    run(main())


def test_open_without_the_managed_ledger_znode_is_topic_not_found():
    async def main():
        w = await world()
        await w.store.delete(ML)
        with pytest.raises(TopicError) as info:
            await w.open(w.broker())
        assert info.value.status is TopicStatus.TOPIC_NOT_FOUND and ML in info.value.message
    run(main())


# ---------------------------------------------------------------------------------------------- persist, recover
def test_kill_after_a_persist_recovers_everything_from_the_cursor_ledger_opened_with_recovery():
    async def main():
        w = await world()
        a = await w.open(w.broker(), initial_position="earliest")
        holes_pattern(a)
        a.ack_batch_indexes(P(100, 0), [0, 3], 5)
        assert a.increment_redelivery(P(100, 2)) == 1
        assert a.increment_redelivery(P(100, 2)) == 2
        a.increment_redelivery(P(102, 0))
        a.set_property("dedup/p", 41)
        assert a.dirty
        assert await a.persist(force=True) is True
        assert not a.dirty
        first_ledger = a.stats_internal()["cursorLedger"]
        assert first_ledger >= 0 and (await w.znode())["cursor_ledger"] == first_ledger
        a.ack([P(100, 4)])  # after the last persist: lost by the kill
        a.abort("kill -9")
        b_service = w.broker()
        b = await w.open(b_service)
        stats = b.stats_internal()
        assert stats["recovery"]["source"] == "ledger" and stats["recovery"]["cursorLedger"] == first_ledger
        assert b.mark_delete == P(100, -1) and not b.is_acked(P(100, 4)) and b.is_acked(P(100, 5))
        assert b.state.acked_count == 500 + 3
        assert b.acked_batch_indexes(P(100, 0)) == [0, 3]
        assert b.redelivery_count(P(100, 2)) == 2 and b.redelivery_count(P(102, 0)) == 1
        assert b.properties == {"dedup/p": 41}
        md, _ = await b_service.metadata(first_ledger)
        assert md.is_closed  # recovery closed it: the old writer is fenced
        # the first persist after recovery goes to a NEW ledger; the recovered one is deleted
        await b.persist(force=True)
        second = b.stats_internal()["cursorLedger"]
        assert second not in (first_ledger, -1) and (await w.znode())["cursor_ledger"] == second
        with pytest.raises(LedgerError) as info:
            await b_service.metadata(first_ledger)
        assert info.value.status is LedgerStatus.NO_SUCH_LEDGER
        b.abort("kill -9 again")
        c = await w.open(w.broker())
        assert_same_state(b, c)
    run(main())


def test_clean_close_with_a_small_state_leaves_the_znode_alone_and_deletes_the_ledger():
    async def main():
        w = await world()
        svc = w.broker()
        a = await w.open(svc, initial_position="earliest")
        a.ack([P(100, 3), P(100, 4), P(102, 9)])
        a.increment_redelivery(P(100, 0))
        a.ack_batch_indexes(P(100, 1), [1], 2)
        await a.persist(force=True)
        ledger = a.stats_internal()["cursorLedger"]
        a.ack([P(100, 7)])
        await a.close()
        z = await w.znode()
        assert z["cursor_ledger"] == -1 and z["left_out"] == {}
        assert z["acked_ranges"] == [[100, 3, 4], [100, 7, 7], [102, 9, 9]]
        with pytest.raises(LedgerError):
            await svc.metadata(ledger)
        with pytest.raises(TopicError) as info:
            a.ack([P(100, 9)])
        assert info.value.status is TopicStatus.SERVICE_UNAVAILABLE
        b = await w.open(w.broker())
        assert b.stats_internal()["recovery"]["source"] == "znode" and "reason" not in b.stats_internal()["recovery"]
        assert_same_state(a, b)
    run(main())


def test_clean_close_with_a_large_state_writes_a_final_snapshot_and_closes_the_ledger():
    async def main():
        w = await world()
        svc = w.broker()
        config = replace(CONFIG, ranges_in_metadata_max=10)
        a = await w.open(svc, config, initial_position="earliest")
        holes_pattern(a)  # 500 + 2 ranges
        await a.close()
        z = await w.znode()
        ledger = z["cursor_ledger"]
        assert ledger >= 0 and len(z["acked_ranges"]) == 10 and z["left_out"] == {"acked_ranges": 492}
        md, _ = await svc.metadata(ledger)
        assert md.is_closed and md.last_entry_id == 0
        b = await w.open(w.broker(), config)
        assert b.stats_internal()["recovery"]["source"] == "ledger"
        assert_same_state(a, b)
    run(main())


def test_the_cursor_ledger_rolls_and_the_old_one_is_deleted_after_the_znode_names_the_new():
    async def main():
        w = await world()
        svc = w.broker()
        a = await w.open(svc, replace(CONFIG, cursor_ledger_entries_max=3), initial_position="earliest")
        seen = []
        for i in range(7):
            a.ack([P(100, 2 * i + 1)])
            await a.persist(force=True)
            seen.append(a.stats_internal()["cursorLedger"])
        assert seen[0] == seen[1] == seen[2] != seen[3] == seen[4] == seen[5] != seen[6]
        assert (await w.znode())["cursor_ledger"] == seen[6]
        for old in (seen[0], seen[3]):
            with pytest.raises(LedgerError):
                await svc.metadata(old)
        a.abort("kill")
        b = await w.open(w.broker())
        assert_same_state(a, b)
    run(main())


def test_chunked_snapshots_recover_and_a_partial_tail_falls_back_to_the_previous_snapshot():
    async def main():
        w = await world()
        config = replace(CONFIG, cursor_snapshot_chunk_bytes=64)
        a = await w.open(w.broker(), config, initial_position="earliest")
        rng = random.Random(3)
        a.ack([P(100, e) for e in range(1, 1000) if rng.random() < 0.5])
        await a.persist(force=True)
        persisted = a.stats_internal()["lastPersist"]
        assert persisted["bytes"] > 2 * 64 and persisted["entries"] == (persisted["bytes"] + 63) // 64 + 1  # + marker
        a.abort("kill")
        b = await w.open(w.broker(), config)
        assert b.stats_internal()["recovery"]["source"] == "ledger"
        assert_same_state(a, b)
        # a snapshot whose chunks reached the ledger but whose marker did not
        await b.persist(force=True)
        expected = list(b.state.ranges())
        b.ack([P(102, e) for e in range(0, 500, 3)])
        packed = codec.pack(codec.CursorSnapshot.of(b.state), seq=999)
        chunks = codec.entries_for(packed, 64)
        assert len(chunks) > 1
        await asyncio.gather(*[b._handle.append(c) for c in chunks])  # white box: a persist cut before its marker
        b.abort("kill in the middle of a persist")
        c = await w.open(w.broker(), config)
        rec = c.stats_internal()["recovery"]
        assert rec["source"] == "ledger" and "without its marker" in rec["skipped"][0]
        assert list(c.state.ranges()) == expected
    run(main())


# ---------------------------------------------------------------------------------------------- fall-backs
def test_append_failure_falls_back_to_the_znode_with_bounded_ranges_and_says_what_was_not_persisted():
    async def main():
        w = await world(bookies=("b0", "b1"))
        svc = w.broker()
        config = replace(CONFIG, ranges_in_metadata_max=5)
        a = await w.open(svc, config, initial_position="earliest")
        a.ack([P(100, 1)])
        await a.persist(force=True)
        ledger = a.stats_internal()["cursorLedger"]
        holes_pattern(a)
        w.fake["b1"].down = True  # E=2 with 2 bookies: no replacement, the append fails
        await a.persist(force=True)
        stats = a.stats_internal()
        assert stats["lastPersist"]["to"] == "znode" and stats["lastPersist"]["notPersisted"] == {"acked_ranges": 497}
        assert stats["persistErrors"] == 1 and "NOT_ENOUGH_BOOKIES" in stats["lastPersistError"]
        assert stats["cursorLedger"] == -1 and stats["state"] == "NoLedger" and a.dirty  # still owes a full snapshot
        assert any("NOT persisted: 497 acked_ranges" in line for line in w.logs)
        z = await w.znode()
        assert z["cursor_ledger"] == -1 and len(z["acked_ranges"]) == 5 and z["left_out"] == {"acked_ranges": 497}
        with pytest.raises(LedgerError):
            await svc.metadata(ledger)  # the znode no longer names it: deleted
        a.abort("kill")
        b = await w.open(w.broker(), config)
        rec = b.stats_internal()["recovery"]
        assert rec["source"] == "znode" and rec["leftOut"] == {"acked_ranges": 497}
        assert [(str(x), str(y)) for x, y in b.state.ranges()] == \
               [("100:0", "100:1"), ("100:2", "100:3"), ("100:4", "100:5"), ("100:6", "100:7"), ("100:8", "100:9")]
        # the bookie is back: the next persist starts a new ledger with the whole state
        w.fake["b1"].down = False
        await b.persist(force=True)
        assert b.stats_internal()["lastPersist"]["to"] == "ledger" and not b.dirty
    run(main())


def test_a_fallback_after_acks_moved_the_mark_delete_writes_the_snapshot_as_it_was_taken():
    """A persist takes its snapshot, then waits on the cursor ledger; meanwhile acks slide the mark-delete over
    the acks the snapshot holds. The append fails and the snapshot goes to the znode: with its mark-delete and
    every ack it held, not its mark-delete without the acks the state has since folded into a later one."""
    async def main():
        w = await world(bookies=("b0", "b1"))
        svc = w.broker()
        a = await w.open(svc, initial_position="earliest")
        await a.persist(force=True)  # the cursor ledger exists: the next persist appends to it
        a.ack([P(100, 1), P(100, 3)])  # held as individual acks: 100:0 is not acked
        w.fake["b1"].gate = asyncio.Event()
        persist = asyncio.ensure_future(a.persist(force=True))
        await wait_until_async(lambda: w.fake["b1"].waiting == 1, 5.0, message="the snapshot's append to wait")
        a.ack([P(100, 0), P(100, 2)])  # the mark-delete slides to 100:3: no individual ack is left in the state
        assert a.mark_delete == P(100, 3) and list(a.state.ranges()) == []
        w.fake["b1"].down = True  # E=2 with 2 bookies: no replacement, the append fails
        w.fake["b1"].gate.set()
        await asyncio.wait_for(persist, 5.0)
        assert a.stats_internal()["lastPersist"]["to"] == "znode" and a.dirty  # the slide is not persisted yet
        z = await w.znode()
        assert z["mark_delete"] == [100, -1] and z["acked_ranges"] == [[100, 1, 1], [100, 3, 3]], z
        a.abort("kill")
        b = await w.open(w.broker())
        assert b.mark_delete == P(100, -1) and b.state.is_acked(P(100, 1)) and b.state.is_acked(P(100, 3))
    run(main())


def test_an_unreadable_cursor_ledger_falls_back_to_the_znode_and_says_so():
    async def main():
        w = await world()
        svc = w.broker()
        a = await w.open(svc, initial_position="earliest")
        a.ack([P(100, 0), P(100, 1), P(100, 5)])  # mark-delete 100:1
        await a.persist(force=True)  # the znode names the ledger with mark-delete 100:1, range 100:5
        a.ack([P(100, 9)])
        await a.persist(force=True)
        ledger = a.stats_internal()["cursorLedger"]
        a.abort("kill")
        await svc.delete_ledger(ledger, password=CURSOR_PASSWORD)  # lost
        b = await w.open(w.broker())
        rec = b.stats_internal()["recovery"]
        assert rec["source"] == "znode" and f"cursor ledger {ledger} is unreadable" in rec["reason"]
        assert "NO_SUCH_LEDGER" in rec["reason"]
        assert any("WARNING" in line and "falling back" in line for line in w.logs)
        assert b.mark_delete == P(100, 1) and b.is_acked(P(100, 5)) and not b.is_acked(P(100, 9))
        # never "earliest": what the znode had is kept
        assert b.backlog() == 1500 - 3
    run(main())


def test_a_cursor_ledger_without_a_complete_snapshot_falls_back_to_the_znode():
    async def main():
        w = await world()
        a = await w.open(w.broker(), replace(CONFIG, cursor_snapshot_chunk_bytes=64), initial_position="earliest")
        a.ack([P(100, 0)])
        await a.persist(force=True)
        await a._handle.append(b"not a cursor entry")  # white box: damage at the tail
        a.abort("kill")
        b = await w.open(w.broker(), CONFIG)
        rec = b.stats_internal()["recovery"]
        assert rec["source"] == "ledger" and "magic" in rec["skipped"][0]
        assert b.mark_delete == P(100, 0)
    run(main())


# ---------------------------------------------------------------------------------------------- ownership
def test_another_broker_recovering_the_cursor_fences_the_first():
    async def main():
        w = await world()
        fenced = []
        a = await w.open(w.broker(), on_fenced=fenced.append, initial_position="earliest")
        a.ack([P(100, 0)])
        await a.persist(force=True)
        b = await w.open(w.broker())  # takes over: recovery-opens (fences) a's cursor ledger
        a.ack([P(100, 1)])
        with pytest.raises(TopicError) as info:
            await a.persist(force=True)
        assert info.value.status is TopicStatus.TOPIC_FENCED and "fenced" in info.value.message
        assert len(fenced) == 1 and a.stats_internal()["state"] == "Fenced"
        for call in (lambda: a.ack([P(100, 2)]), lambda: a.increment_redelivery(P(100, 3))):
            with pytest.raises(TopicError) as info:
                call()
            assert info.value.status is TopicStatus.TOPIC_FENCED
        with pytest.raises(TopicError):
            await a.close()
        await b.persist(force=True)  # the new owner is unaffected
        assert b.mark_delete == P(100, 0)
    run(main())


def test_a_znode_cas_conflict_is_topic_fenced_and_the_new_ledger_is_not_left_behind():
    async def main():
        w = await world()
        svc = w.broker()
        a = await w.open(svc, initial_position="earliest")
        b = await w.open(w.broker())
        b.ack([P(100, 0)])
        await b.persist(force=True)  # CASes the znode: a's version is stale
        before = set(await svc.list_ledgers())
        a.ack([P(100, 5)])
        with pytest.raises(TopicError) as info:
            await a.persist(force=True)
        assert info.value.status is TopicStatus.TOPIC_FENCED and PATH in info.value.message
        assert set(await svc.list_ledgers()) == before  # a's fresh cursor ledger was deleted again
        assert (await w.znode())["cursor_ledger"] == b.stats_internal()["cursorLedger"]
    run(main())


# ---------------------------------------------------------------------------------------------- seek, delete
def test_seek_is_persisted_to_the_ledger_and_the_znode_before_it_returns():
    async def main():
        w = await world()
        a = await w.open(w.broker(), initial_position="earliest")
        holes_pattern(a)
        a.ack_cumulative(P(100, 500))
        await a.persist(force=True)
        await a.seek(P(100, 10))
        assert a.mark_delete == P(100, 9) and a.read_position == P(100, 10) and a.state.acked_count == 0
        assert not a.dirty and (await w.znode())["mark_delete"] == [100, 9]
        a.abort("kill")
        b = await w.open(w.broker())
        assert b.mark_delete == P(100, 9) and b.state.acked_count == 0
    run(main())


def test_delete_removes_the_znode_then_the_cursor_ledger():
    async def main():
        w = await world()
        svc = w.broker()
        a = await w.open(svc, initial_position="earliest")
        a.ack([P(100, 3)])
        await a.persist(force=True)
        ledger = a.stats_internal()["cursorLedger"]
        await a.delete()
        assert await w.store.exists(PATH) is None
        with pytest.raises(LedgerError):
            await svc.metadata(ledger)
        with pytest.raises(TopicError):
            a.ack([P(100, 4)])
    run(main())


# ---------------------------------------------------------------------------------------------- background
def test_a_dirty_cursor_is_persisted_by_the_background_task_every_interval():
    async def main():
        w = await world()
        a = await w.open(w.broker(), initial_position="earliest", background_flush=True)
        await wait_until_async(lambda: w.clock.sleepers == 1, 5, message="the flush task sleeping")
        w.clock.advance(1000)  # not dirty: nothing written
        await wait_until_async(lambda: w.clock.sleepers == 1, 5, message="the flush task sleeping again")
        assert a.stats_internal()["lastPersist"] == {}
        a.ack([P(100, 0), P(100, 2)])
        assert await a.persist() is True  # not rate-limited yet: nothing was persisted before
        a.ack([P(100, 4)])
        assert await a.persist() is False  # within the interval: left to the background task
        w.clock.advance(999)
        await wait_until_async(lambda: w.clock.sleepers == 1, 5)
        assert a.dirty
        w.clock.advance(1)
        await wait_until_async(lambda: not a.dirty, 5, message="the background persist")
        assert a.stats_internal()["lastPersist"]["seq"] == 2
        a.abort("kill")
        assert w.clock.sleepers == 1  # the cancelled task's sleep is never woken
        b = await w.open(w.broker())
        assert b.is_acked(P(100, 4))
    run(main())


def test_stats_internal_has_pulsars_fields():
    async def main():
        w = await world()
        a = await w.open(w.broker(), initial_position="earliest")
        a.ack([P(100, 3), P(100, 4), P(100, 7)] + [P(102, e) for e in range(0, 400, 2)])
        a.read_position = P(100, 10)
        a.ack_batch_indexes(P(100, 0), [1], 3)
        a.set_property("x", 1)
        s = a.stats_internal()
        assert s["markDeletePosition"] == "100:-1" and s["readPosition"] == "100:10"
        assert s["individuallyDeletedMessages"].startswith("[(100:2..100:4], (100:6..100:7], (102:-1..102:0],")
        assert s["individuallyDeletedMessages"].endswith(", ...(102 more)]")
        assert s["totalNonContiguousDeletedMessagesRange"] == 202 and s["individuallyDeletedEntries"] == 203
        assert s["batchDeletedIndexes"] == 1 and s["properties"] == {"x": 1}
        assert s["numberOfEntriesSinceFirstNotAckedMessage"] == 11 and s["backlog"] == 1500 - 203
        assert s["state"] == "NoLedger" and s["cursorLedger"] == -1 and s["dirty"]
        await a.persist(force=True)
        s = a.stats_internal()
        assert s["state"] == "Open" and s["cursorLedgerLastEntry"] == 0 and s["lastPersist"]["to"] == "ledger"
        with pytest.raises(TopicError) as info:
            a.ack([P(102, 500)])
        assert info.value.status is TopicStatus.INVALID_ACK and "102:500" in info.value.message
    run(main())


def test_abort_while_a_persist_waits_for_the_bookies_writes_nothing_more():
    async def main():
        w = await world()
        a = await w.open(w.broker(), initial_position="earliest")
        a.ack([P(100, 0)])
        await a.persist(force=True)
        _, version = await w.store.get(PATH)
        for b in w.bookie_ids:
            w.fake[b].gate = asyncio.Event()
        a.ack([P(100, 1)])
        persist = asyncio.ensure_future(a.persist(force=True))
        await wait_until_async(lambda: sum(w.fake[b].waiting for b in w.bookie_ids) >= 2, 5,
                               message="the snapshot's adds waiting at the bookies")
        a.abort("kill -9")
        for b in w.bookie_ids:
            w.fake[b].gate.set()
        with pytest.raises(TopicError) as info:
            await persist
        assert info.value.status is TopicStatus.SERVICE_UNAVAILABLE and "aborted" in info.value.message
        assert (await w.store.get(PATH))[1] == version  # no fall-back to the znode after the abort
        b = await w.open(w.broker())
        # the interrupted snapshot may or may not have reached the bookies: either way the ledger is recovered
        assert b.stats_internal()["recovery"]["source"] == "ledger" and b.mark_delete in (P(100, 0), P(100, 1))
    run(main())


async def lossy_cursor(w) -> tuple[LossyStore, ManagedCursor]:
    """A cursor ("earliest", no background flush) whose metadata session can lose answers."""
    svc = w.broker()
    lossy = LossyStore(svc.store)
    cursor = await ManagedCursor.open(name="sub", path=PATH, layout=w.layout, ledgers=svc, store=lossy,
                                      clock=w.clock, config=CONFIG, initial_position="earliest",
                                      background_flush=False)
    return lossy, cursor


def test_a_lost_answer_to_a_znode_write_is_settled_by_reading_it_back():
    async def main():
        w = await world()
        lossy, a = await lossy_cursor(w)
        a.ack([P(100, 0)])
        lossy.lose_next_set = "applied"
        await a.persist(force=True)  # creates the cursor ledger, CASes the znode: the answer is lost, the write is in
        assert (await w.znode())["cursor_ledger"] == a.stats_internal()["cursorLedger"] >= 0
        a.ack([P(100, 1)])
        await a.seek(P(100, 5))  # the next CAS uses the version read back: no false fencing
        assert (await w.znode())["mark_delete"] == [100, 4]
        lossy.lose_next_set = "not applied"
        with pytest.raises(TopicError) as info:
            await a.seek(P(100, 7))
        assert info.value.status is TopicStatus.METADATA_ERROR and "not applied" in info.value.message
        assert (await w.znode())["mark_delete"] == [100, 4]
        await a.seek(P(100, 7))  # and the cursor goes on
        assert (await w.znode())["mark_delete"] == [100, 6]
    run(main())


def test_a_seek_whose_znode_write_fails_still_reports_the_snapshot_a_recovery_reads():
    """The seek's snapshot is in the cursor ledger, its znode write is refused: a new owner recovers the snapshot
    (the ledger is read first), so the persisted mark-delete (retention trims below it) is the snapshot's."""
    async def main():
        w = await world()
        lossy, a = await lossy_cursor(w)
        await a.seek(P(100, 5))
        assert a.persisted_mark_delete == P(100, 4)
        lossy.lose_next_set = "not applied"
        with pytest.raises(TopicError) as info:
            await a.seek(P(100, 2))
        assert info.value.status is TopicStatus.METADATA_ERROR
        assert a.persisted_mark_delete == P(100, 1)
        b = await w.open(w.broker())
        assert b.mark_delete == P(100, 1)
    run(main())


def test_a_seek_whose_every_write_fails_reports_the_lower_mark_delete_it_may_have_left():
    """The cursor ledger cannot take the seek's snapshot and the znode write loses its answer and its read-back: the
    znode may hold the seek's state, so the persisted mark-delete is the lower of the two from then on."""
    async def main():
        w = await world()
        lossy, a = await lossy_cursor(w)
        await a.seek(P(100, 5))
        for b in w.bookie_ids:  # a terminal answer: the append fails at once and the state goes to the znode
            w.fake[b].error = StatusCode.UNAUTHORIZED
        lossy.lose_next_set, lossy.fail_next_get = "applied later", True
        with pytest.raises(TopicError) as info:
            await a.seek(P(100, 2))
        assert info.value.status is TopicStatus.METADATA_ERROR
        assert a.persisted_mark_delete == P(100, 1)
    run(main())


async def a_write_whose_answer_and_read_back_are_lost():
    """A cursor at mark-delete (100, 2) whose write of (100, 4) lost its answer and its read-back: the write is held
    back (it may land later). Returns (world, store, cursor)."""
    w = await world()
    lossy, cursor = await lossy_cursor(w)
    await cursor.seek(P(100, 3))
    lossy.lose_next_set, lossy.fail_next_get = "applied later", True
    with pytest.raises(TopicError) as info:
        await cursor.seek(P(100, 5))
    assert info.value.status is TopicStatus.METADATA_ERROR
    return w, lossy, cursor


def test_a_znode_write_that_lands_after_its_answer_was_lost_is_not_taken_for_another_broker():
    """The write lands later (queued over a reconnect). The next write meets a version conflict made by the
    cursor's own write: it writes on top of it, no fencing."""
    async def main():
        w, lossy, a = await a_write_whose_answer_and_read_back_are_lost()
        await lossy.deliver_held()
        assert (await w.znode())["mark_delete"] == [100, 4]
        await a.seek(P(100, 7))
        assert (await w.znode())["mark_delete"] == [100, 6]
        assert a.stats_internal()["state"] != "Fenced"
    run(main())


def test_deleting_a_cursor_whose_lost_znode_write_landed_deletes_it_instead_of_fencing():
    """The held write lands just before the delete (a client's queue is in order): the delete meets the version
    that write made, the cursor's own, and deletes on top of it."""
    async def main():
        w, lossy, a = await a_write_whose_answer_and_read_back_are_lost()
        await a.delete()
        assert await w.store.exists(PATH) is None
        assert a.stats_internal()["state"] != "Fenced"
    run(main())


def test_a_version_conflict_not_made_by_the_cursors_own_lost_write_still_fences():
    async def main():
        w, lossy, a = await a_write_whose_answer_and_read_back_are_lost()
        path, _, version = lossy.held
        lossy.held = None  # it never lands: another broker writes the znode instead
        await w.store.set(path, b"another broker's cursor state", version)
        with pytest.raises(TopicError) as info:
            await a.seek(P(100, 7))
        assert info.value.status is TopicStatus.TOPIC_FENCED
    run(main())


async def a_ledger_switch_whose_znode_answer_and_read_back_are_lost():
    """A cursor that rolls its cursor ledger at every persist, with ack holes beyond what its znode takes; a switch
    to a new cursor ledger whose znode write lost its answer and its read-back (held back: it may land later).
    Returns (world, store, cursor, the new ledger that write names, its broker's LedgerService)."""
    w = await world()
    svc = w.broker()
    lossy = LossyStore(svc.store)
    config = replace(CONFIG, cursor_ledger_entries_max=1, ranges_in_metadata_max=2)
    cursor = await ManagedCursor.open(name="sub", path=PATH, layout=w.layout, ledgers=svc, store=lossy,
                                      clock=w.clock, config=config, initial_position="earliest",
                                      background_flush=False)
    cursor.ack([P(100, 1), P(100, 3)])
    await cursor.persist(force=True)
    holes_pattern(cursor)
    lossy.lose_next_set, lossy.fail_next_get = "applied later", True
    with pytest.raises(TopicError) as info:
        await cursor.persist(force=True)
    assert info.value.status is TopicStatus.METADATA_ERROR
    named = json.loads(lossy.held[1])["cursor_ledger"]
    assert named != cursor.stats_internal()["cursorLedger"]
    return w, lossy, cursor, named, svc


def test_a_cursor_ledger_a_lost_znode_write_may_name_is_kept_and_a_recovery_reads_it():
    async def main():
        w, lossy, a, named, svc = await a_ledger_switch_whose_znode_answer_and_read_back_are_lost()
        await lossy.deliver_held()  # it lands: the znode names the new ledger
        assert (await w.znode())["cursor_ledger"] == named
        await svc.metadata(named)  # still there
        a.abort("kill -9")
        b = await w.open(w.broker())
        assert b.stats_internal()["recovery"]["source"] == "ledger"
        assert_same_state(a, b)  # every hole, not only the two ranges the znode holds
    run(main())


@pytest.mark.parametrize("lands", [True, False], ids=["the-lost-write-lands", "it-never-lands"])
def test_the_next_persist_settles_a_lost_ledger_switch_and_deletes_the_ledger_it_no_longer_names(lands):
    async def main():
        w, lossy, a, named, svc = await a_ledger_switch_whose_znode_answer_and_read_back_are_lost()
        if not lands:
            lossy.held = None
        a.ack([P(102, 9)])
        await a.persist(force=True)  # lands first when it does: the cursor writes on top of its own write
        current = (await w.znode())["cursor_ledger"]
        assert current not in (named, -1) and a.stats_internal()["state"] != "Fenced"
        with pytest.raises(LedgerError):
            await svc.metadata(named)  # named by nothing now: deleted, not leaked
        a.abort("kill -9")
        b = await w.open(w.broker())
        assert_same_state(a, b)
    run(main())


@pytest.mark.parametrize("outage", ["bookies down", "bookies answer an error", "reads fail on the closed ledger"])
def test_a_cursor_ledger_that_cannot_be_read_now_fails_the_open_and_loses_nothing(outage):
    async def main():
        w = await world()
        a = await w.open(w.broker(), initial_position="earliest")
        a.ack([P(100, 0), P(100, 1), P(100, 5)])
        await a.persist(force=True)  # the znode names the ledger (mark-delete 100:1 then)
        a.ack([P(100, 2), P(100, 3)])  # mark-delete 100:3: only in the cursor ledger
        await a.persist(force=True)
        ledger = a.stats_internal()["cursorLedger"]
        a.abort("kill -9")
        if outage == "reads fail on the closed ledger":  # recovered (closed) by a broker that died at once
            (await w.open(w.broker())).abort("kill -9")
        for b in w.bookie_ids:  # a transient outage: the ledger exists, its bookies cannot serve it now
            if outage == "bookies down":
                w.fake[b].down = True
            else:
                w.fake[b].error = StatusCode.IO_ERROR
        svc = w.broker()
        with pytest.raises(TopicError) as info:
            await w.open(svc)
        assert info.value.status is TopicStatus.SERVICE_UNAVAILABLE and f"cursor ledger {ledger}" in info.value.message
        znode = await w.znode()
        assert znode["cursor_ledger"] == ledger and znode["mark_delete"] == [100, 1]  # untouched
        for b in w.bookie_ids:
            w.fake[b].down = False
            w.fake[b].error = None
        c = await w.open(svc)  # the retry, once the bookies serve again
        assert c.stats_internal()["recovery"]["source"] == "ledger"
        assert c.mark_delete == P(100, 3) and c.is_acked(P(100, 5))
    run(main())


def test_a_seek_queued_behind_a_persist_under_way_lowers_the_persisted_mark_delete_only_when_it_runs():
    """Topics seed 711854: a seek waits for the cursor's lock while a persist waits for its bookies. Until the seek
    runs, the persisted mark-delete is the one already durable (retention may trim below it, and does); once it
    runs it is the seek's, clamped to the first entry when the target's ledger was trimmed meanwhile (Pulsar's
    asyncResetCursor: getNextValidPosition). That drop is the client's seek, not a regression."""
    async def main():
        w = await world()
        a = await w.open(w.broker(), initial_position="earliest")
        a.ack_cumulative(P(102, 3))
        await a.persist(force=True)
        assert a.persisted_mark_delete == P(102, 3)
        for b in w.bookie_ids:
            w.fake[b].gate = asyncio.Event()
        a.ack_cumulative(P(102, 9))
        persist = asyncio.ensure_future(a.persist(force=True))
        await wait_until_async(lambda: sum(w.fake[b].waiting for b in w.bookie_ids) >= 2, 5,
                               message="the snapshot's adds waiting at the bookies")
        seek = asyncio.ensure_future(a.seek(P(100, 2)))
        await wait_until_async(lambda: seek.done() or a._lock._waiters, 5, message="the seek at the cursor's lock")
        assert not seek.done() and a.mark_delete == P(102, 9)    # the seek waits for the lock
        assert a.persisted_mark_delete == P(102, 3)               # what is durable: trimming ledger 100 is right
        w.layout.trim(2)                                          # retention drops ledgers 100 and 101
        for b in w.bookie_ids:
            w.fake[b].gate.set()
        await persist
        await seek
        first = w.layout.first_position()
        assert first == P(102, 0)
        assert a.mark_delete == a.persisted_mark_delete == w.layout.previous_position(first) == P(102, -1)
        a.abort("kill")
        b = await w.open(w.broker())
        assert b.mark_delete == P(102, -1)                        # what a recovery comes back with
    run(main())


def test_closed_cleanly_only_once_a_close_put_the_whole_state_where_the_next_owner_reads_it():
    async def main():
        w = await world()
        lossy, a = await lossy_cursor(w)
        a.ack([P(100, 0)])
        await a.persist(force=True)
        a.ack([P(100, 1)])
        assert not a.closed_cleanly
        lossy.lose_next_set = "not applied"  # the close's znode write (ZooKeeper connection lost): not clean
        with pytest.raises(TopicError) as info:
            await a.close()
        assert info.value.status is TopicStatus.METADATA_ERROR and not a.closed_cleanly
        b = await w.open(w.broker())  # the next owner gets the last snapshot written: 100:1 comes back
        assert b.is_acked(P(100, 0)) and not b.is_acked(P(100, 1))
        b.ack([P(100, 1)])
        await b.close()
        assert b.closed_cleanly
        c = await w.open(w.broker())
        assert c.is_acked(P(100, 1))
        c.abort("kill -9")
        assert not c.closed_cleanly
    run(main())


def test_a_close_that_leaves_ranges_out_of_the_znode_is_not_clean():
    async def main():
        w = await world()
        config = replace(CONFIG, ranges_in_metadata_max=10)
        a = await w.open(w.broker(), config, initial_position="earliest")
        holes_pattern(a)  # 502 ranges: more than the znode takes
        for b in w.bookie_ids:  # the cursor ledger cannot take the final snapshot
            w.fake[b].error = StatusCode.UNAUTHORIZED
        await a.close()
        assert (await w.znode())["left_out"] == {"acked_ranges": 492}
        assert not a.closed_cleanly
    run(main())
