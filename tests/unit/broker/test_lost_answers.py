"""The broker's shells never lose the end of a bookie call (broker/driver.py, broker/reader.py).

A call may end in asyncio.CancelledError although nobody cancelled the task awaiting it: gRPC does that to
the calls of a channel that is closed (the transport retires a channel after a connection failure). The
transport now reports that as BookieUnreachable; these tests hold the shells to the same rule by themselves,
over FakeBookies whose `underneath` bookies end every call so: the ReadOutbox delivers None for each entry of
such a call, read_lac counts the bookie as unanswered, an add counts as unanswered (so the writer changes
the ensemble), and a ledger recovery whose write-back meets such a bookie still closes the ledger. Without
that, each of these waited forever (the chaos bookie-kill seed 616843657 hang). The owner's own cancellation
(ReadOutbox.close) still delivers nothing.
"""
from __future__ import annotations

import asyncio

import pytest

from bksim.broker.reader import ReadOutbox, read_lac
from bksim.metadata.ledger_metadata import LedgerState
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus, StatusCode
from helpers import wait_until_async
from fakes.bookies import FakeBookies
from tests.unit.broker.test_ledger_service import PW, world

LEDGER = 7
WAIT_S = 5.0  # bound of every wait (the fake answers at once)


class CancelledUnderneath(FakeBookies):
    """FakeBookies whose bookies in `underneath` end every call in CancelledError raised inside the call, as
    gRPC does when it cancels a call of a closed channel (the awaiting task was not cancelled)."""

    def __init__(self, ids) -> None:
        super().__init__(ids)
        self.underneath: set[str] = set()
        self.cancelled_calls = 0

    async def _reach(self, bookie_id):
        b = await super()._reach(bookie_id)
        if bookie_id in self.underneath:
            self.cancelled_calls += 1
            raise asyncio.CancelledError()
        return b


def run(coro):
    return asyncio.run(coro)


def test_a_read_call_cancelled_underneath_delivers_none_for_each_entry():
    async def main():
        fake = CancelledUnderneath(["b0", "b1"])
        fake.underneath.add("b1")
        got = []
        outbox = ReadOutbox(fake, LEDGER, lambda *reply: got.append(reply), master_key=b"k" * 32)  # fences need it
        for i in (3, 4):
            outbox.read("b0", i, fence=True)
            outbox.read("b1", i, fence=True)
        await wait_until_async(lambda: len(got) == 4, WAIT_S, interval_s=0, message=f"4 replies (have {got})")
        assert sorted(r for r in got if r[0] == "b1") == [("b1", 3, None, b""), ("b1", 4, None, b"")]
        assert sorted(r[:3] for r in got if r[0] == "b0") == [("b0", 3, StatusCode.NO_ENTRY),
                                                              ("b0", 4, StatusCode.NO_ENTRY)]
        assert fake.cancelled_calls == 1
    run(main())


def test_the_owners_close_still_delivers_nothing():
    async def main():
        fake = CancelledUnderneath(["b0"])
        fake["b0"].gate = asyncio.Event()
        got = []
        outbox = ReadOutbox(fake, LEDGER, lambda *reply: got.append(reply))
        outbox.read("b0", 1)
        await wait_until_async(lambda: fake["b0"].waiting == 1, WAIT_S, interval_s=0, message="call in flight")
        outbox.close()  # cancels our call: that cancellation is ours, not a lost answer
        await wait_until_async(lambda: fake["b0"].waiting == 0, WAIT_S, interval_s=0, message="call ended")
        assert got == [] and fake.cancelled_calls == 0
    run(main())


def test_read_lac_counts_a_call_cancelled_underneath_as_unanswered():
    async def main():
        store, fake0, [a] = await world(["b0", "b1", "b2"])
        h = await a.create_ledger(3, 3, 2, password=PW)
        for i in range(3):
            await h.append(b"e%d" % i)  # one at a time: entry 2 carries LAC 1
        md = h.metadata
        fake = CancelledUnderneath(["b0", "b1", "b2"])
        fake.bookies = fake0.bookies  # the same stored entries
        fake.underneath.add("b2")  # coverage needs 2 of the 3 LAC answers: b0 and b1 give it
        lac = await asyncio.wait_for(read_lac(fake, h.ledger_id, md), WAIT_S)
        assert lac == 1  # entry 2 carries LAC 1
        fake.underneath.add("b1")  # now no coverage: an error, not a hang
        with pytest.raises(LedgerError) as info:
            await asyncio.wait_for(read_lac(fake, h.ledger_id, md), WAIT_S)
        assert info.value.status is LedgerStatus.READ_FAILED
        assert "b1" in info.value.message and "b2" in info.value.message
    run(main())


def test_adds_and_a_recovery_write_back_cancelled_underneath_change_the_ensemble_and_finish():
    async def main():
        store, fake0, [a, b] = await world(["b0", "b1", "b2", "b3"], brokers=2)
        fake = CancelledUnderneath(["b0", "b1", "b2", "b3"])
        fake.bookies = fake0.bookies
        a.transport = b.transport = fake
        # a writer: the adds to b1 end cancelled underneath; the writer must replace b1, not wait for it
        h = await a.create_ledger(2, 2, 2, password=PW)
        fake.underneath.add(h.metadata.ensemble[1])
        ids = await asyncio.wait_for(asyncio.gather(*[h.append(b"e%d" % i) for i in range(4)]), WAIT_S)
        assert ids == [0, 1, 2, 3]
        assert h.metadata.ensemble[1] not in fake.underneath
        fake.underneath.clear()
        # a recovery: its write-back to a bookie whose calls end cancelled underneath changes the ensemble too
        h2 = await a.create_ledger(2, 2, 2, password=PW)
        for i in range(3):
            await h2.append(b"f%d" % i)  # one at a time: entry 2 carries LAC 1
        await a.close(close_ledgers=False)  # the writer dies; entries 0..2 are on both bookies
        first, second = h2.metadata.ensemble
        fake.underneath.add(second)  # every call to it (fence, reads, write-back) is cancelled underneath;
        # `first` alone gives fencing coverage (E=Qw=Qa=2) and decides every read (1 negative proves absence)
        closed = await asyncio.wait_for(b.recover_ledger(h2.ledger_id, password=PW), WAIT_S)
        assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 2
        assert second not in closed.ensemble
    run(main())
