"""The broker's ledger client (broker/ledgers.py and its shells) over the in-memory metadata store and
FakeBookies (an in-memory fake of the bookie transport). The real-process versions of these scenarios are in
tests/integration/test_broker_*.py; the simulator checks the same code under faults."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.broker.ledgers import LedgerService
from bksim.metadata.ledger_metadata import LedgerState
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.model.config import BrokerConfig
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus
from helpers import wait_until_async
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock

BOOKIES = [f"b{i}" for i in range(5)]
PW = b"secret"


async def world(bookies=BOOKIES, *, brokers=1, config=BrokerConfig(speculative_read_ms=50)):
    store = InMemoryMetadataStore()
    reg = store.session("bookies")
    for b in bookies:
        await reg.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
    fake = FakeBookies(bookies)
    services = [LedgerService(store=store.session(f"broker-{i}"), transport=fake, rng=random.Random(i),
                              clock=ManualClock(sleeps_advance=True), config=config) for i in range(brokers)]
    return store, fake, services


def run(coro):
    return asyncio.run(coro)


def test_append_acks_in_order_and_close_records_the_end():
    async def main():
        store, fake, [svc] = await world()
        h = await svc.create_ledger(3, 2, 2, password=PW)
        futures = [h.append(b"x%d" % i) for i in range(100)]
        ids = await asyncio.gather(*futures)
        assert ids == list(range(100))
        md = await svc.close_ledger(h.ledger_id, PW)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 99
        assert md.length == sum(len(b"x%d" % i) for i in range(100))
        got = [e.payload async for e in svc.read_entries(h.ledger_id, 0, -1, password=PW)]
        assert got == [b"x%d" % i for i in range(100)]
        # striping: each entry on exactly Qw=2 bookies
        copies = sum(len(fake[b].entries.get(h.ledger_id, {})) for b in BOOKIES)
        assert copies == 200
    run(main())


def test_bad_quorums_and_not_enough_bookies():
    async def main():
        _, _, [svc] = await world()
        for e, qw, qa in ((2, 3, 2), (3, 2, 3), (0, 0, 0), (3, 3, 0)):
            with pytest.raises(LedgerError) as info:
                await svc.create_ledger(e, qw, qa, password=PW)
            assert info.value.status is LedgerStatus.BAD_REQUEST
        with pytest.raises(LedgerError) as info:
            await svc.create_ledger(6, 3, 2, password=PW)
        assert info.value.status is LedgerStatus.NOT_ENOUGH_BOOKIES
        assert await svc.list_ledgers() == []  # nothing half-created
    run(main())


def test_bookie_failure_changes_the_ensemble_and_keeps_every_acknowledged_entry():
    async def main():
        store, fake, [svc] = await world()
        h = await svc.create_ledger(3, 3, 2, password=PW)
        first = await asyncio.gather(*[h.append(b"a%d" % i) for i in range(20)])
        victim = h.metadata.ensemble[1]
        fake[victim].down = True
        second = await asyncio.gather(*[h.append(b"b%d" % i) for i in range(20)])
        assert first + second == list(range(40))
        md, _ = await svc.metadata(h.ledger_id)
        assert len(md.segments) == 2 and victim not in md.segments[1].ensemble
        assert md.segments[1].first_entry_id <= 20
        await svc.close_ledger(h.ledger_id, PW)
        fake[victim].down = False
        got = [e.payload async for e in svc.read_entries(h.ledger_id, 0, 39, password=PW)]
        assert got == [b"a%d" % i for i in range(20)] + [b"b%d" % i for i in range(20)]
    run(main())


def test_recovery_by_another_broker_fences_the_writer():
    async def main():
        store, fake, [a, b] = await world(brokers=2)
        h = await a.create_ledger(3, 2, 2, password=PW)
        acked = await asyncio.gather(*[h.append(b"e%d" % i) for i in range(30)])
        md = await b.open_ledger(h.ledger_id, password=PW, recover=True)
        assert md.state is LedgerState.CLOSED and md.last_entry_id >= acked[-1]
        later = h.append(b"late")
        with pytest.raises(LedgerError) as info:
            await later
        assert info.value.status is LedgerStatus.FENCED
        with pytest.raises(LedgerError) as info:
            h.append(b"later still")
        assert info.value.status is LedgerStatus.FENCED
        with pytest.raises(LedgerError) as info:
            a.writer_of(h.ledger_id)  # a new Append stream to A hears why, not "not the writer"
        assert info.value.status is LedgerStatus.FENCED
        # a second recovery returns the same end (idempotent)
        again = await a.open_ledger(h.ledger_id, password=PW, recover=True)
        assert (again.last_entry_id, again.length) == (md.last_entry_id, md.length)
    run(main())


def test_recovery_finds_unconfirmed_tail_and_writes_it_back():
    async def main():
        store, fake, [a, b] = await world(brokers=2)
        h = await a.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*[h.append(b"e%d" % i) for i in range(10)])
        # the writer "dies" after its last adds reached every bookie but before anyone heard the acks:
        # the LAC piggybacked on the bookies is 8 (entry 9 carries LAC 8)
        await a.close(close_ledgers=False)
        md, _ = await b.metadata(h.ledger_id)
        assert md.state is LedgerState.OPEN
        closed = await b.recover_ledger(h.ledger_id, password=PW)
        assert closed.last_entry_id == 9
        got = [e.payload async for e in b.read_entries(h.ledger_id, 0, -1, password=PW)]
        assert got == [b"e%d" % i for i in range(10)]
    run(main())


def test_bad_input_is_refused_precisely():
    async def main():
        store, fake, [a, b] = await world(brokers=2)
        h = await a.create_ledger(3, 2, 2, password=PW)
        await h.append(b"one")
        cases = [
            (a.open_ledger(h.ledger_id, password=b"wrong", recover=False), "UNAUTHORIZED"),
            (a.open_ledger(12345, password=PW, recover=True), "NO_SUCH_LEDGER"),
            (b.close_ledger(h.ledger_id, PW), "NOT_WRITER"),
        ]
        for coro, status in cases:
            with pytest.raises(LedgerError) as info:
                await coro
            assert info.value.status == status
        with pytest.raises(LedgerError) as info:
            [e async for e in a.read_entries(h.ledger_id, 0, 5, password=PW)]
        assert info.value.status is LedgerStatus.READ_BEYOND_LAC
        with pytest.raises(LedgerError) as info:
            h.append(b"x" * (a.config.payload_bytes_max + 1))
        assert info.value.status is LedgerStatus.BAD_REQUEST
        with pytest.raises(LedgerError) as info:
            b.writer_of(h.ledger_id)
        assert info.value.status is LedgerStatus.NOT_WRITER
        await a.close_ledger(h.ledger_id, PW)
        with pytest.raises(LedgerError) as info:
            h.append(b"after close")
        assert info.value.status is LedgerStatus.LEDGER_CLOSED
        with pytest.raises(LedgerError) as info:
            a.writer_of(h.ledger_id)
        assert info.value.status is LedgerStatus.LEDGER_CLOSED
        assert (await a.close_ledger(h.ledger_id, PW)).last_entry_id == 0  # closing again: same end
    run(main())


def test_in_flight_bound_makes_appenders_wait():
    async def main():
        _, fake, [svc] = await world(config=BrokerConfig(append_inflight_max=8))
        h = await svc.create_ledger(3, 2, 2, password=PW)
        gate = asyncio.Event()
        for b in BOOKIES:
            fake[b].gate = gate
        futures = [h.append(b"p") for _ in range(8)]
        waiter = asyncio.ensure_future(h.wait_for_room())
        # every bookie holds a batch at its gate: the appends are out and unanswered
        await wait_until_async(lambda: [fake[b].waiting for b in h.metadata.ensemble] == [1, 1, 1], 5,
                               interval_s=0, message="one add batch at each bookie's gate")
        assert not waiter.done() and h.inflight == 8
        gate.set()
        await asyncio.wait_for(waiter, 5)
        assert await asyncio.gather(*futures) == list(range(8))
    run(main())


def test_append_many_is_all_or_nothing_counts_every_entry_in_flight_and_resolves_with_its_last_id():
    async def main():
        _, fake, [svc] = await world(config=BrokerConfig(append_inflight_max=8, payload_bytes_max=16))
        h = await svc.create_ledger(3, 2, 2, password=PW)
        with pytest.raises(LedgerError) as refused:
            h.append_many([b"ok", b"x" * 17, b"ok"])  # one payload too big: none is appended
        assert refused.value.status is LedgerStatus.BAD_REQUEST and h.writer.last_add_pushed == -1
        gate = asyncio.Event()
        for b in BOOKIES:
            fake[b].gate = gate
        first = h.append_many([b"a%d" % i for i in range(5)])
        second = h.append_many([b"b%d" % i for i in range(3)])
        waiter = asyncio.ensure_future(h.wait_for_room())
        await wait_until_async(lambda: [fake[b].waiting for b in h.metadata.ensemble] == [1, 1, 1], 5,
                               interval_s=0, message="one add batch at each bookie's gate")
        assert h.inflight == 8 and not waiter.done()  # eight entries, two futures: the bound counts entries
        gate.set()
        assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [4, 7]
        await asyncio.wait_for(waiter, 5)
        assert h.inflight == 0
        got = [e.payload async for e in svc.read_entries(h.ledger_id, 0, -1, password=PW)]
        assert got == [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(3)]
    run(main())


def test_read_fails_over_to_the_next_replica_and_reports_unreadable_entries():
    async def main():
        _, fake, [svc] = await world()
        h = await svc.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*[h.append(b"r%d" % i) for i in range(5)])
        await svc.close_ledger(h.ledger_id, PW)
        ens = h.metadata.ensemble
        fake[ens[0]].down = True
        got = [e.payload async for e in svc.read_entries(h.ledger_id, 0, 4, password=PW)]
        assert got == [b"r%d" % i for i in range(5)]
        for b in ens:
            fake[b].entries.get(h.ledger_id, {}).pop(2, None)
        with pytest.raises(LedgerError) as info:
            [e async for e in svc.read_entries(h.ledger_id, 0, 4, password=PW)]
        assert info.value.status is LedgerStatus.READ_FAILED
    run(main())


def test_the_writer_broker_checks_the_password_too():
    async def main():
        _, _, [svc] = await world()
        h = await svc.create_ledger(3, 2, 2, password=PW)
        await h.append(b"x")
        with pytest.raises(LedgerError) as info:
            await svc.read_lac(h.ledger_id, password=b"wrong")
        assert info.value.status is LedgerStatus.UNAUTHORIZED
        assert await svc.read_lac(h.ledger_id, password=PW) == 0
    run(main())


def test_a_wrong_password_is_unauthorized_even_for_an_ended_ledger():
    async def main():
        _, _, [svc] = await world()
        h = await svc.create_ledger(3, 2, 2, password=PW)
        await svc.close_ledger(h.ledger_id, PW)
        with pytest.raises(LedgerError) as info:
            svc.writer_of(h.ledger_id, b"wrong")
        assert info.value.status is LedgerStatus.UNAUTHORIZED
        with pytest.raises(LedgerError) as info:
            svc.writer_of(h.ledger_id, PW)
        assert info.value.status is LedgerStatus.LEDGER_CLOSED
    run(main())


def test_append_calls_hear_the_precise_reason():
    async def main():
        _, _, [a, b] = await world(brokers=2)
        h = await a.create_ledger(3, 2, 2, password=PW)
        assert await a.appender(h.ledger_id, PW) is h
        for svc, ledger_id, password, status in ((b, 999, PW, "NO_SUCH_LEDGER"), (b, h.ledger_id, b"no", "UNAUTHORIZED"),
                                                 (b, h.ledger_id, PW, "NOT_WRITER")):
            with pytest.raises(LedgerError) as info:
                await svc.appender(ledger_id, password)
            assert info.value.status == status
        await a.close_ledger(h.ledger_id, PW)
        with pytest.raises(LedgerError) as info:
            await b.appender(h.ledger_id, PW)
        assert info.value.status is LedgerStatus.LEDGER_CLOSED
    run(main())


def test_a_bookie_that_failed_is_asked_last_for_the_rest_of_a_read():
    async def main():
        _, fake, [svc] = await world(config=BrokerConfig(read_window_max=2, speculative_read_ms=50))
        h = await svc.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*[h.append(b"r%d" % i) for i in range(30)])
        await svc.close_ledger(h.ledger_id, PW)
        dead = h.metadata.ensemble[0]
        fake[dead].down = True
        calls = []
        original = fake.read_entries

        async def counting(bookie, *args, **kw):
            calls.append(bookie)
            return await original(bookie, *args, **kw)
        fake.read_entries = counting
        got = [e.payload async for e in svc.read_entries(h.ledger_id, 0, 29, password=PW)]
        assert got == [b"r%d" % i for i in range(30)]
        # the dead bookie is first in a third of the write sets (10 entries); once it failed, it is asked last,
        # so only reads started before the first failure (the window of 2) still go to it first
        assert 1 <= calls.count(dead) <= 2
    run(main())


def test_an_append_while_the_close_waits_for_pending_adds_is_ledger_closed():
    async def main():
        _, fake, [svc] = await world()
        h = await svc.create_ledger(3, 2, 2, password=PW)
        gate = asyncio.Event()
        for b in BOOKIES:
            fake[b].gate = gate
        pending = h.append(b"first")
        closing = asyncio.ensure_future(h.close())
        await wait_until_async(lambda: sum(fake[b].waiting for b in BOOKIES) == 2, 5, interval_s=0,
                               message="the add at both bookies of its write set")
        with pytest.raises(LedgerError) as info:
            h.append(b"too late")
        assert info.value.status is LedgerStatus.LEDGER_CLOSED
        gate.set()
        assert await pending == 0
        assert (await closing).last_entry_id == 0
    run(main())
