"""Two recoveries of one ledger at once, with a bookie of its ensemble down (a topic takeover: the old owner's
failed-add path and the new owner's open both recover the ledger). Over the in-memory metadata store and
FakeBookies (an in-memory fake of the bookie transport), with each recovery's replacement bookie fixed and the
second one's held, so the interleaving is the one that matters: both write-backs replace the same bookie at the
same entry, and the first close comes while the second write-back has not reached its replacement."""
from __future__ import annotations

import asyncio
import random

from bksim.broker.ledgers import LedgerService
from bksim.metadata.ledger_metadata import LedgerState
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.model.config import BrokerConfig
from helpers import wait_until_async
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock

BOOKIES = [f"b{i}" for i in range(6)]
PW = b"secret"
ENTRIES = 30




def test_two_recoveries_at_once_close_only_over_segments_that_got_the_entries():
    async def main():
        store = InMemoryMetadataStore()
        registrations = store.session("bookies")
        for b in BOOKIES:
            await registrations.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
        fake = FakeBookies(BOOKIES)
        writer, first, second = [
            LedgerService(store=store.session(f"broker-{i}"), transport=fake, rng=random.Random(i),
                          clock=ManualClock(sleeps_advance=True), config=BrokerConfig(speculative_read_ms=50)) for i in range(3)]
        handle = await writer.create_ledger(3, 2, 2, password=PW)
        lid = handle.ledger_id
        await asyncio.gather(*[handle.append(b"e%d" % i) for i in range(ENTRIES - 1)])
        await handle.append(b"e%d" % (ENTRIES - 1))
        await writer.close(close_ledgers=False)  # the writer dies: entry 29 carries LAC 28, so recovery writes it back
        ensemble = handle.metadata.ensemble
        tail_write_set = handle.metadata.write_set(ENTRIES - 1)
        down = tail_write_set[0]
        fake[down].down = True
        spare = [b for b in BOOKIES if b not in ensemble]
        y, z = spare[0], spare[1]

        async def only(bookie):
            return [bookie]
        first.writable_bookies = lambda: only(y)  # the first recovery replaces the dead bookie with y
        second.writable_bookies = lambda: only(z)  # the second with z, whose answers are held
        fake[z].gate = asyncio.Event()

        run_first = asyncio.create_task(first.recover_ledger(lid, password=PW))
        run_second = asyncio.create_task(second.recover_ledger(lid, password=PW))
        closed = await asyncio.wait_for(run_first, 10)
        assert closed.state is LedgerState.CLOSED and closed.last_entry_id == ENTRIES - 1
        # at the moment of the close every entry is on Qa bookies of its write set in the CLOSED metadata
        for entry_id in range(closed.last_entry_id + 1):
            holders = [b for b in closed.write_set(entry_id) if entry_id in fake[b].entries.get(lid, {})]
            assert len(holders) >= closed.ack_quorum_size, (entry_id, closed.write_set(entry_id), holders,
                                                            closed.segments)
        assert closed.segments[0].ensemble == ensemble and closed.segments[-1].first_entry_id == ENTRIES - 1
        assert z not in {b for s in closed.segments for b in s.ensemble}, closed.segments
        # no two consecutive segments name the same ensemble
        assert all(a.ensemble != b.ensemble for a, b in zip(closed.segments, closed.segments[1:])), closed.segments
        # the second recovery, released, finds the ledger CLOSED and returns that end
        await wait_until_async(lambda: fake[z].waiting > 0 or run_second.done(), 10)
        fake[z].gate.set()
        other = await asyncio.wait_for(run_second, 10)
        assert other == closed
        stored, _ = await first.metadata(lid)
        assert stored == closed
    asyncio.run(main())
