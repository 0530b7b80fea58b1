"""ReadOutbox (broker/reader.py): ReadEntry requests of one event-loop turn go out per (bookie, fence) as
read_entries calls of at most `batch_max` ids; each entry's answer comes back on its own, in id order; a
call without an answer gives every entry status None. And the shells that use it: recovery's read-forward
and `read_entries` make few calls (one per bookie and window turn), with the same results as before."""
from __future__ import annotations

import asyncio

from bksim.broker.reader import ReadOutbox
from bksim.formats.entry import encode_entry
from bksim.model.status import StatusCode
from helpers import wait_until_async
from fakes.bookies import FakeBookies
from tests.unit.broker.test_ledger_service import PW, world

LEDGER = 7
KEY = b"k" * 32


def run(coro):
    return asyncio.run(coro)


def entry(entry_id: int) -> bytes:
    return encode_entry(LEDGER, entry_id, entry_id - 1, 0, b"p%d" % entry_id)


async def stored(bookies=("b0", "b1"), n=6) -> FakeBookies:
    fake = FakeBookies(bookies)
    for b in bookies:
        assert await fake.add(b, [(entry(i), KEY, 0) for i in range(n)]) == [StatusCode.OK] * n
    return fake


async def settle(outbox: ReadOutbox, got: list, expected: int) -> None:
    await wait_until_async(lambda: len(got) >= expected, 5, interval_s=0,
                           message=f"{expected} replies delivered (have {len(got)})")


def test_reads_of_one_turn_go_as_one_call_per_bookie_and_fence():
    async def main():
        fake = await stored()
        got = []
        outbox = ReadOutbox(fake, LEDGER, lambda *reply: got.append(reply), master_key=KEY)
        for i in (0, 1, 9):
            outbox.read("b0", i)
        outbox.read("b1", 2)
        outbox.read("b0", 3, fence=True)
        outbox.read("b0", 4, fence=True)
        assert outbox.calls == 0  # nothing leaves before the turn ends
        await settle(outbox, got, 6)
        assert fake["b0"].read_calls == [(LEDGER, (0, 1, 9), False), (LEDGER, (3, 4), True)]
        assert fake["b1"].read_calls == [(LEDGER, (2,), False)]
        assert outbox.calls == 3
        assert got[:3] == [("b0", 0, StatusCode.OK, entry(0)), ("b0", 1, StatusCode.OK, entry(1)),
                           ("b0", 9, StatusCode.NO_ENTRY, b"")]
        assert sorted(got[3:]) == sorted([("b1", 2, StatusCode.OK, entry(2)), ("b0", 3, StatusCode.OK, entry(3)),
                                          ("b0", 4, StatusCode.OK, entry(4))])
        assert LEDGER in fake["b0"].fenced and LEDGER not in fake["b1"].fenced
        # a read issued in a later turn (a speculative one, a window slide) joins the next flush
        outbox.read("b1", 5)
        await settle(outbox, got, 7)
        assert fake["b1"].read_calls[-1] == (LEDGER, (5,), False) and got[-1] == ("b1", 5, StatusCode.OK, entry(5))
    run(main())


def test_a_long_list_is_split_at_batch_max():
    async def main():
        fake = await stored(("b0",))
        got = []
        outbox = ReadOutbox(fake, LEDGER, lambda *reply: got.append(reply), batch_max=2)
        for i in range(5):
            outbox.read("b0", i)
        await settle(outbox, got, 5)
        assert [ids for _, ids, _ in fake["b0"].read_calls] == [(0, 1), (2, 3), (4,)]
        assert sorted(e for _, e, _, _ in got) == [0, 1, 2, 3, 4]
        assert all(status is StatusCode.OK for _, _, status, _ in got)
    run(main())


def test_a_call_without_answer_gives_every_entry_status_none():
    async def main():
        fake = await stored()
        fake["b1"].down = True
        got = []
        outbox = ReadOutbox(fake, LEDGER, lambda *reply: got.append(reply))
        outbox.read("b1", 0)
        outbox.read("b1", 1)
        outbox.read("b0", 1)
        await settle(outbox, got, 3)
        assert sorted(r for r in got if r[0] == "b1") == [("b1", 0, None, b""), ("b1", 1, None, b"")]
        assert ("b0", 1, StatusCode.OK, entry(1)) in got
    run(main())


def test_after_close_nothing_is_sent_or_delivered():
    async def main():
        fake = await stored()
        gate = fake["b0"].gate = asyncio.Event()
        got = []
        outbox = ReadOutbox(fake, LEDGER, lambda *reply: got.append(reply))
        outbox.read("b0", 0)
        await wait_until_async(lambda: fake["b0"].waiting == 1, 5, interval_s=0, message="the call at the gate")
        outbox.read("b0", 1)
        outbox.close()
        gate.set()
        # a later call to the same bookie answered means an uncancelled earlier one would have been too
        later = []
        other = ReadOutbox(fake, LEDGER, lambda *reply: later.append(reply))
        other.read("b0", 2)
        await wait_until_async(lambda: later, 5, interval_s=0, message="a later read of b0 answered")
        assert got == []
        # the call in flight was cancelled; the pending one never left
        assert fake["b0"].read_calls == [(LEDGER, (2,), False)]
    run(main())


def test_recovery_reads_forward_in_few_batched_calls_and_finds_every_entry():
    async def main():
        store, fake, [a, b] = await world(brokers=2)
        h = await a.create_ledger(3, 3, 2, password=PW)
        n = 300
        await asyncio.gather(*[h.append(b"e%d" % i) for i in range(n)])
        await a.close(close_ledgers=False)  # the writer dies: every entry is on every bookie, nothing closed
        closed = await b.recover_ledger(h.ledger_id, password=PW)
        assert closed.last_entry_id == n - 1
        calls = [c for bookie in fake.bookies.values() for c in bookie.read_calls if c[0] == h.ledger_id]
        assert all(fence for _, _, fence in calls)  # every recovery read fences
        ids = sorted(i for _, entry_ids, _ in calls for i in entry_ids)
        # fencing reads (-1) and every entry the read-forward asked for, from each of the 3 bookies
        assert ids.count(-1) == 3 and all(ids.count(i) == 3 for i in range(0, n - 1)), ids[:10]
        # far fewer calls than entries read: a window of entries goes to a bookie in one call
        assert len(calls) < len(ids) / 4, (len(calls), len(ids))
        got = [e.payload async for e in b.read_entries(h.ledger_id, 0, -1, password=PW)]
        assert got == [b"e%d" % i for i in range(n)]
    run(main())


def test_reader_batches_its_window_and_still_speculates_past_a_silent_bookie():
    async def main():
        from bksim.model.config import BrokerConfig
        _, fake, [svc] = await world(config=BrokerConfig(read_window_max=16, speculative_read_ms=20))
        h = await svc.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*[h.append(b"r%d" % i) for i in range(64)])
        await svc.close_ledger(h.ledger_id, PW)
        for bookie in fake.bookies.values():
            bookie.read_calls.clear()
        got = [e.payload async for e in svc.read_entries(h.ledger_id, 0, 63, password=PW)]
        assert got == [b"r%d" % i for i in range(64)]
        calls = [c for bookie in fake.bookies.values() for c in bookie.read_calls]
        assert sum(len(ids) for _, ids, _ in calls) >= 64 and len(calls) < 64 / 2, calls
        # a bookie that holds its answers: the speculative timer asks another replica in a later flush
        silent = h.metadata.ensemble[0]
        fake[silent].gate = asyncio.Event()
        got = [e.payload async for e in svc.read_entries(h.ledger_id, 0, 5, password=PW)]
        fake[silent].gate.set()
        assert got == [b"r%d" % i for i in range(6)]
    run(main())
