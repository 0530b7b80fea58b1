"""The managed ledger (topics/managed_ledger.py) over the in-memory metadata store and FakeBookies (an
in-memory fake of the bookie transport): order, rollover, the failed-add path (recover, acknowledge what is
durable, re-send the rest), takeover fencing, trimming and the LedgerLayout arithmetic. check_invariants()
runs after every operation; its own tests corrupt a state and see it caught, and the transition table
refuses a move it does not list."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.broker.ledgers import LedgerService
from bksim.topics.errors import TopicError
from bksim.model.errors import LedgerError
from bksim.model.invariants import InvariantError
from bksim.model.status import LedgerStatus, TopicStatus
from bksim.topics import managed_ledger
from bksim.topics.managed_ledger import FINAL, TRANSITIONS, ManagedLedger, ManagedLedgerState, ManagedLedgerStateError
from bksim.topics.names import TopicName
from bksim.topics.positions import Position
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.model.config import BrokerConfig, TopicConfig
from helpers import wait_until_async
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock
from fakes.lossy_store import LossyStore

BOOKIES = [f"b{i}" for i in range(4)]
TOPIC = TopicName.parse("persistent://t/ns/orders")


async def world(config=TopicConfig(), brokers=1):
    store = InMemoryMetadataStore()
    reg = store.session("bookies")
    for b in BOOKIES:
        await reg.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
    fake = FakeBookies(BOOKIES)
    await ManagedLedger.create_znode(store.session("admin"), TOPIC)
    mls = []
    for i in range(brokers):
        session = store.session(f"broker-{i}")
        svc = LedgerService(store=session, transport=fake, rng=random.Random(i), clock=ManualClock(sleeps_advance=True),
                            config=BrokerConfig(speculative_read_ms=50, bookie_timeout_ms=200))
        mls.append(ManagedLedger(TOPIC, ledgers=svc, store=session, clock=ManualClock(sleeps_advance=True), config=config))
    return store, fake, mls


def run(coro):
    return asyncio.run(coro)


def checked(*mls):
    for ml in mls:
        ml.check_invariants()


async def read_all(ml):
    out, pos = [], ml.first_position()
    while pos <= ml.last_confirmed:
        got = await ml.read(pos, 50)
        if not got:
            break
        out += got
        pos = ml.next_position(got[-1][0])
    return out


def test_appends_confirm_in_order_and_roll_by_entries():
    async def main():
        _, _, [ml] = await world(TopicConfig(ledger_entries_max=10))
        checked(ml)
        await ml.open()
        checked(ml)
        positions = await asyncio.gather(*[ml.append(b"m%d" % i) for i in range(35)])
        checked(ml)
        assert positions == sorted(positions) and len(set(positions)) == 35
        assert len(ml.ledger_ids()) >= 4  # 10 entries per ledger
        assert [p for p, _ in await read_all(ml)] == positions
        assert [d for _, d in await read_all(ml)] == [b"m%d" % i for i in range(35)]
        checked(ml)
        assert ml.entries_between(Position(-1, -1), ml.last_confirmed) == 35
        assert ml.next_position(positions[9]) == positions[10]
        assert ml.previous_position(positions[10]) == positions[9]
    run(main())


def test_reopen_by_another_broker_fences_the_old_one_and_keeps_everything():
    async def main():
        _, _, [a, b] = await world(brokers=2)
        await a.open()
        acked = await asyncio.gather(*[a.append(b"a%d" % i) for i in range(20)])
        checked(a)
        await b.open()  # takeover: recovers a's ledger, starts its own
        checked(a, b)
        assert b.last_confirmed == acked[-1]
        assert [d for _, d in await read_all(b)] == [b"a%d" % i for i in range(20)]
        with pytest.raises(TopicError) as info:  # a's next write is fenced (ledger fenced, then the CAS fails)
            await a.append(b"late")
        assert info.value.status is TopicStatus.TOPIC_FENCED
        assert a.state is ManagedLedgerState.FENCED and a.stats_internal()["state"] == "Fenced"
        checked(a, b)
        more = await asyncio.gather(*[b.append(b"b%d" % i) for i in range(5)])
        assert more[0] > acked[-1]
        checked(a, b)
    run(main())


def test_failed_add_recovers_the_ledger_and_resends_only_what_is_not_durable():
    async def main():
        store, fake, [ml] = await world(TopicConfig(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2))
        await ml.open()
        await asyncio.gather(*[ml.append(b"x%d" % i) for i in range(5)])
        checked(ml)
        first_ledger = ml.ledger_ids()[-1]
        ensemble = ml._handle.metadata.ensemble
        reg = store.session("bookies")
        spares = [b for b in BOOKIES if b not in ensemble]
        for b in spares:  # no spare bookie: the ensemble change fails, so the add fails
            await store.session("admin").delete(bookie_path(b))
        fake[ensemble[0]].down = True
        futures = [ml.append(b"y%d" % i) for i in range(5)]
        await wait_until_async(lambda: ml.state == "Rolling", 5, 0.01, "roll after the failed add")
        fake[ensemble[0]].down = False
        for b in spares:
            await reg.create(bookie_path(b), b"{}", ephemeral=True)
        positions = await asyncio.wait_for(asyncio.gather(*futures), 10)
        assert positions == sorted(positions)
        checked(ml)
        data = [d for _, d in await read_all(ml)]
        assert data == [b"x%d" % i for i in range(5)] + [b"y%d" % i for i in range(5)]  # no duplicates
        assert ml.ledger_ids()[-1] != first_ledger
        checked(ml)
    run(main())


def test_trim_deletes_only_a_consumed_prefix_metadata_first():
    async def main():
        store, _, [ml] = await world(TopicConfig(ledger_entries_max=5))
        await ml.open()
        positions = await asyncio.gather(*[ml.append(b"m%d" % i) for i in range(20)])
        checked(ml)
        ids = ml.ledger_ids()
        # slowest cursor consumed up to the end of the second ledger
        slowest = positions[9]
        deleted = await ml.trim(slowest, retention_ms=0, retention_bytes=-1)
        assert deleted == ids[:2]
        assert ml.ledger_ids() == ids[2:]
        checked(ml)
        assert await ml.trim(None, retention_ms=-1, retention_bytes=-1) == []  # keep forever
        checked(ml)
        for lid in deleted:
            assert await store.session("x").exists(f"/ledgers/00/0000/L{lid:04d}") is None
    run(main())


class FlakyDeletes:
    """The topic's ledger service, but the first `failures` deletes fail with a metadata error (ZooKeeper away)."""

    def __init__(self, inner, failures: int) -> None:
        self.inner, self.failures, self.calls = inner, failures, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def delete_ledger(self, ledger_id, *, password):
        self.calls.append(ledger_id)
        if self.failures > 0:
            self.failures -= 1
            raise LedgerError(LedgerStatus.METADATA_ERROR, "ZooKeeper unreachable")
        await self.inner.delete_ledger(ledger_id, password=password)


@pytest.mark.parametrize("failures, deleted", [(2, True), (3, False)])
def test_a_trimmed_ledger_whose_delete_fails_is_deleted_again_later_three_tries_in_all(failures, deleted):
    """Pulsar deletes a ledger the topic no longer lists up to DEFAULT_LEDGER_DELETE_RETRIES (3) times,
    DEFAULT_LEDGER_DELETE_BACKOFF_TIME_SEC (60 s) apart; after that the ledger leaks (its metadata and its entries)."""
    async def main():
        store, _, [plain] = await world(TopicConfig(ledger_entries_max=5))
        flaky = FlakyDeletes(plain._ledgers, failures)
        clock = ManualClock()
        ml = ManagedLedger(TOPIC, ledgers=flaky, store=plain._store, clock=clock, config=plain.config)
        await ml.open()
        positions = [await ml.append(b"m%d" % i) for i in range(10)]
        victim = ml.ledger_ids()[0]
        assert await ml.trim(positions[4], retention_ms=0, retention_bytes=-1) == [victim]
        path = f"/ledgers/00/0000/L{victim:04d}"
        assert flaky.calls == [victim] and await store.session("x").exists(path) is not None
        for tries in (2, 3):
            await wait_until_async(lambda: clock.sleepers > 0, 5.0, message="a retry waiting")
            clock.advance(managed_ledger.LEDGER_DELETE_BACKOFF_MS - 1)
            assert clock.sleepers == 1 and len(flaky.calls) == tries - 1  # not before the back-off
            clock.advance(1)
            await wait_until_async(lambda: len(flaky.calls) == tries, 5.0, message=f"try {tries}")
        await wait_until_async(lambda: not ml._deletions, 5.0, message="the last try to end")
        gone = await store.session("x").exists(path) is None
        assert gone == deleted
        assert clock.sleepers == 0 and flaky.calls == [victim] * managed_ledger.LEDGER_DELETE_RETRIES
    run(main())


def test_close_is_final_and_the_transition_table_refuses_other_moves():
    async def main():
        _, _, [ml] = await world(TopicConfig(ledger_entries_max=3))
        with pytest.raises(ManagedLedgerStateError, match="cannot move from None to Rolling"):
            ml._move(ManagedLedgerState.ROLLING)  # a roll needs an open ledger
        await ml.open()
        await asyncio.gather(*[ml.append(b"c%d" % i) for i in range(7)])
        checked(ml)
        await ml.close()
        assert ml.state is ManagedLedgerState.CLOSED
        checked(ml)
        with pytest.raises(TopicError) as info:
            ml.append(b"late")
        assert info.value.status is TopicStatus.SERVICE_UNAVAILABLE
        for state in ManagedLedgerState:
            with pytest.raises(ManagedLedgerStateError, match="from Closed"):
                ml._move(state)
        assert ml.state is ManagedLedgerState.CLOSED
        ml.abandon("too late")  # a closed ledger stays closed
        assert ml.state is ManagedLedgerState.CLOSED
        checked(ml)
    run(main())
    assert all(not TRANSITIONS[s] for s in FINAL) and set(TRANSITIONS) == set(ManagedLedgerState)


def confirmed_op(ml):
    """A pending append already confirmed at the next position, left at the head of the queue."""
    op = managed_ledger._PendingAdd(b"z", asyncio.get_running_loop().create_future(), None)
    op.ledger_id, op.sent_id = ml.last_confirmed.ledger, ml.last_confirmed.entry + 1
    op.entry_id = op.sent_id
    return op


@pytest.mark.parametrize("corrupt, invariant", [
    (lambda ml: ml.info.ledgers.reverse(), "LedgersOrdered"),
    (lambda ml: setattr(ml.info.ledgers[0], "closed_ms", 0), "OnlyLastLedgerOpen"),
    (lambda ml: setattr(ml, "_current", ml.info.ledgers[0]), "CurrentIsLast"),
    (lambda ml: setattr(ml.info.ledgers[-1], "entries", ml.info.ledgers[-1].entries + 1), "CountsConsistent"),
    (lambda ml: setattr(ml.info.ledgers[0], "size", ml.info.ledgers[0].size - 1), "CountsConsistent"),
    (lambda ml: setattr(ml, "_state", ManagedLedgerState.ROLLING), "StateMatchesFields"),
    (lambda ml: ml._pending.appendleft(confirmed_op(ml)), "ConfirmedInOrder"),
    (lambda ml: setattr(ml, "_cache_bytes", ml._cache_bytes + 1), "CacheBounded"),
])
def test_a_corrupted_state_is_caught(corrupt, invariant):
    async def main():
        _, _, [ml] = await world(TopicConfig(ledger_entries_max=4))
        await ml.open()
        await asyncio.gather(*[ml.append(b"k%d" % i) for i in range(10)])  # two full ledgers, one being written
        checked(ml)
        corrupt(ml)
        with pytest.raises(InvariantError) as info:
            ml.check_invariants()
        assert info.value.invariant == invariant, info.value
    run(main())


@pytest.mark.parametrize("damaged", [b"{not json", b'{"ledgers":[{}]}', b"[" * 100_000])
def test_a_damaged_znode_fails_the_open_with_metadata_error(damaged):
    async def main():
        store, _fake, [ml] = await world()
        admin = store.session("admin")
        _, version = await admin.get(TOPIC.managed_ledger_path)
        await admin.set(TOPIC.managed_ledger_path, damaged, version)
        with pytest.raises(TopicError) as e:
            await ml.open()
        assert e.value.status is TopicStatus.METADATA_ERROR and "managed ledger" in str(e.value)
    run(main())


def test_a_roll_whose_list_write_lands_after_its_answer_was_lost_does_not_fence_the_topic():
    """The roll's list write loses its answer and its read-back; the write is still queued and lands just before the
    retry's, which then meets a version its own write made: it writes on top of it (topics/owned_znode.py)."""
    async def main():
        _, _, [plain] = await world(TopicConfig(ledger_entries_max=3))
        lossy = LossyStore(plain._store)
        ml = ManagedLedger(TOPIC, ledgers=plain._ledgers, store=lossy, clock=plain._clock, config=plain.config)
        await ml.open()
        first = [await ml.append(b"a%d" % i) for i in range(3)]
        lossy.lose_next_set, lossy.fail_next_get = "applied later", True
        rolled = await ml.append(b"b")  # the roll's first list write is lost; the retry's goes through
        assert rolled.ledger not in {p.ledger for p in first} and not ml.fence_reason
        checked(ml)
        assert [p for p, _ in await read_all(ml)] == first + [rolled]
    run(main())


def test_a_close_waits_for_an_append_in_flight_whose_caller_cancelled_its_future():
    """A producer's connection drops while its Send waits for a bookie: cancelling the Send cancels the append's
    future, but the entry is still in flight to the ledger. close() waits for the append itself (and for one made
    while it waits), not for its future: the managed ledger is never CLOSED with an append pending (topics seed
    731267: the close saw the cancelled future as settled and moved to CLOSED with 1 append pending)."""
    async def main():
        _, fake, [ml] = await world()
        await ml.open()
        await ml.append(b"a0")
        gate = asyncio.Event()
        for b in BOOKIES:
            fake[b].gate = gate
        send = asyncio.ensure_future(ml.append(b"a1"))
        await wait_until_async(lambda: any(fake[b].waiting for b in BOOKIES), 5, 0.01, "the add at the bookies")
        send.cancel()  # the caller goes away: the append's future is cancelled, its entry is not
        await wait_until_async(send.done, 5, 0.01, "the Send cancelled")
        assert ml._pending and ml._pending[0].future.cancelled()
        closing = asyncio.ensure_future(ml.close())
        await wait_until_async(lambda: getattr(ml, "_drained", None) is not None or ml.state is not ManagedLedgerState.LEDGER_OPENED,
                               5, 0.01, "the close waiting for the pending append (or, wrongly, closing)")
        checked(ml)  # before the fix: StateMatchesFields, CLOSED with 1 append pending
        assert ml.state is ManagedLedgerState.LEDGER_OPENED and len(ml._pending) == 1
        at_bookies = sum(fake[b].waiting for b in BOOKIES)
        late = ml.append(b"a2")  # made while the close waits: waited for too
        await wait_until_async(lambda: sum(fake[b].waiting for b in BOOKIES) > at_bookies, 5, 0.01,
                               "the late append's adds at the bookies")
        checked(ml)
        assert ml.state is ManagedLedgerState.LEDGER_OPENED and len(ml._pending) == 2
        gate.set()
        await asyncio.wait_for(closing, 10)
        assert ml.state is ManagedLedgerState.CLOSED and not ml._pending
        checked(ml)
        assert [d for _, d in await read_all(ml)] == [b"a0", b"a1", b"a2"]
        assert await late == ml.last_confirmed
    run(main())
