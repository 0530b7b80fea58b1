"""The ledger service's placement quarantine (broker/ledgers.py): a bookie whose calls go unanswered
`quarantine_errors` times within `quarantine_window_ms` is not chosen for new ensembles or replacements for
`quarantine_ms`; when that leaves too few bookies, placement falls back to the quarantined ones. Over the
in-memory metadata store, FakeBookies and a ManualClock that moves only when the test says."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.broker.ledgers import LedgerService
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path
from bksim.model.config import BrokerConfig
from bksim.model.errors import LedgerError
from bksim.model.status import LedgerStatus
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock

PW = b"secret"
CONFIG = BrokerConfig(speculative_read_ms=50, quarantine_errors=3, quarantine_window_ms=10_000, quarantine_ms=60_000)


async def world(bookies, config=CONFIG):
    store = InMemoryMetadataStore()
    registrations = store.session("bookies")
    for b in bookies:
        await registrations.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
    clock = ManualClock()
    lines: list[str] = []
    service = LedgerService(store=store.session("broker"), transport=FakeBookies(bookies), rng=random.Random(7),
                            clock=clock, config=config, log=lines.append)
    return service, clock, lines


def run(coro):
    return asyncio.run(coro)


def test_a_bookie_failing_n_times_within_the_window_is_not_picked_until_its_quarantine_ends():
    async def main():
        bookies = [f"b{i}" for i in range(5)]
        service, clock, lines = await world(bookies)
        for _ in range(2):
            service.note_bookie_failure("b0")
        assert service.quarantined() == {}  # two of three
        service.note_bookie_failure("b0")
        assert service.quarantined() == {"b0": 60_000}
        assert any("b0: quarantined" in line for line in lines)
        for _ in range(30):
            assert "b0" not in await service.choose_bookies(4)
            handle = await service.create_ledger(4, 2, 2, password=PW)
            assert "b0" not in handle.metadata.ensemble
            handle.abort("test")
        assert "b0" not in await service.replacement_candidates(["b1", "b2", "b3"])
        clock.advance(60_000)
        assert service.quarantined() == {}
        picked = set()
        for _ in range(30):
            picked.update(await service.choose_bookies(4))
        assert "b0" in picked
        assert "b0" in await service.replacement_candidates(["b1", "b2", "b3"])
    run(main())


def test_failures_spread_wider_than_the_window_do_not_quarantine():
    async def main():
        service, clock, _ = await world(["b0", "b1", "b2"])
        for _ in range(5):
            service.note_bookie_failure("b0")
            clock.advance(5_000)  # at most two failures in any 10 s window
        assert service.quarantined() == {}
    run(main())


def test_too_few_bookies_outside_quarantine_falls_back_to_quarantined_ones_and_says_so():
    async def main():
        service, clock, lines = await world(["b0", "b1", "b2", "b3"])
        for b in ("b0", "b1"):
            for _ in range(3):
                service.note_bookie_failure(b)
        assert set(service.quarantined()) == {"b0", "b1"}
        handle = await service.create_ledger(3, 2, 2, password=PW)  # 2 unquarantined for E=3: fall back
        assert len(handle.metadata.ensemble) == 3
        handle.abort("test")
        assert any("using quarantined ones too" in line for line in lines)
        assert sorted(await service.choose_bookies(2)) == ["b2", "b3"]  # enough outside quarantine: no fallback
        # a writer of [b2, b3, b0] replacing b0 has no unquarantined bookie outside its ensemble: b1 is offered
        assert "b1" in await service.replacement_candidates(["b2", "b3", "b0"])
        with pytest.raises(LedgerError) as info:
            await service.choose_bookies(2, exclude=["b0", "b1", "b2"])
        assert info.value.status is LedgerStatus.NOT_ENOUGH_BOOKIES
    run(main())


def test_unanswered_adds_and_reads_of_the_ledger_client_count_toward_quarantine():
    async def main():
        bookies = [f"b{i}" for i in range(5)]
        one_strike = BrokerConfig(speculative_read_ms=50, quarantine_errors=1, quarantine_ms=60_000)
        service, clock, _ = await world(bookies, config=one_strike)
        fake = service.transport
        handle = await service.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*[handle.append(b"a%d" % i) for i in range(5)])
        victim = handle.metadata.ensemble[0]
        fake[victim].down = True
        await asyncio.gather(*[handle.append(b"b%d" % i) for i in range(5)])  # the add to the victim: unanswered
        assert list(service.quarantined()) == [victim]
        fake[victim].down = False  # back, but quarantined: not chosen
        for _ in range(20):
            h = await service.create_ledger(4, 2, 2, password=PW)
            assert victim not in h.metadata.ensemble
            h.abort("test")
        await service.close_ledger(handle.ledger_id, PW)
        clock.advance(60_000)
        assert service.quarantined() == {}
        reader = handle.metadata.ensemble_for(0)[0]  # the first replica asked for entry 0
        fake[reader].down = True
        got = [e.payload async for e in service.read_entries(handle.ledger_id, 0, 4, password=PW)]
        assert got == [b"a%d" % i for i in range(5)]
        assert list(service.quarantined()) == [reader]
    run(main())


def test_quarantine_errors_zero_never_quarantines():
    async def main():
        config = BrokerConfig(quarantine_errors=0)
        service, _, _ = await world(["b0", "b1", "b2"], config=config)
        for _ in range(10):
            service.note_bookie_failure("b0")
        assert service.quarantined() == {}
    run(main())
