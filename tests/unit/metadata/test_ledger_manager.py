"""Ledger metadata over the port (metadata/ledger_manager.py) on the in-memory store: ids, the read-modify-CAS loop
under conflicts, listing, and garbage in a ledger znode. (The same helpers run on ZooKeeper in the contract.)"""
from __future__ import annotations

import asyncio

import pytest

from bksim.metadata import ledger_manager as ledgers
from bksim.metadata.ledger_metadata import LedgerMetadata, LedgerState
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import IDGEN, ledger_path
from bksim.model.errors import BadVersionError, LedgerStateError, MetadataError, MetadataFormatError, NoNodeError

META = LedgerMetadata.new(["a:1", "b:1", "c:1"], 3, 2, password=b"pw")


def run(coro):
    return asyncio.run(coro)


class RacingStore:
    """A MetadataStore that lets `race` (another writer) run just before each of its first `races` sets:
    the caller's CAS then meets a version it did not read."""

    def __init__(self, inner, race, races: int) -> None:
        self._inner = inner
        self._race = race
        self.races_left = races

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def set(self, path, data, version):
        if self.races_left:
            self.races_left -= 1
            await self._race()
        return await self._inner.set(path, data, version)


def test_ids_start_at_zero_are_consecutive_and_leave_nothing_behind():
    async def scenario():
        tree = InMemoryMetadataStore()
        assert [await ledgers.allocate_ledger_id(tree) for _ in range(3)] == [0, 1, 2]
        other = tree.session("broker-2")
        assert await ledgers.allocate_ledger_id(other) == 3  # one counter for every session
        assert await tree.children(IDGEN) == []
        await tree.create(f"{IDGEN}/unrelated")  # any child created under idgen moves the counter
        assert await ledgers.allocate_ledger_id(tree) == 5
    run(scenario())


def test_an_exhausted_id_counter_is_refused():
    async def scenario():
        tree = InMemoryMetadataStore()
        await tree.create(IDGEN, make_parents=True)
        tree._nodes[IDGEN].child_creates = ledgers.IDGEN_ID_MAX + 1  # as if 2^31 ids had been handed out
        with pytest.raises(MetadataError, match="exhausted"):
            await ledgers.allocate_ledger_id(tree)
        assert await tree.children(IDGEN) == []
    run(scenario())


def test_update_loop_re_decides_after_a_conflict():
    async def scenario():
        tree = InMemoryMetadataStore()
        await ledgers.create_ledger_metadata(tree, 7, META)
        rival = tree.session("broker-2")

        async def rival_changes_ensemble():
            current, version = await ledgers.read_ledger_metadata(rival, 7)
            await ledgers.write_ledger_metadata(rival, 7, current.with_new_segment(4, ("a:1", "d:1", "c:1")), version)

        racing = RacingStore(tree, rival_changes_ensemble, races=1)
        seen = []

        def to_recovery(current: LedgerMetadata) -> LedgerMetadata:
            seen.append(len(current.segments))
            return current.with_state(LedgerState.IN_RECOVERY)

        result, version = await ledgers.update_ledger_metadata(racing, 7, to_recovery, attempts_max=3)
        assert seen == [1, 2]  # decided again on the value the rival wrote
        assert version == 2 and result.state is LedgerState.IN_RECOVERY and len(result.segments) == 2
        assert await ledgers.read_ledger_metadata(tree, 7) == (result, 2)  # the rival's segment kept
    run(scenario())


def test_update_loop_stops_when_the_new_value_forbids_the_change():
    async def scenario():
        tree = InMemoryMetadataStore()
        await ledgers.create_ledger_metadata(tree, 7, META)

        async def recoverer_closes():
            current, version = await ledgers.read_ledger_metadata(tree, 7)
            await ledgers.write_ledger_metadata(tree, 7, current.closed(3, 30), version)

        racing = RacingStore(tree, recoverer_closes, races=1)
        with pytest.raises(LedgerStateError, match="already CLOSED at last_entry_id 3"):
            await ledgers.update_ledger_metadata(racing, 7, lambda m: m.closed(9, 90), attempts_max=5)
        closed, version = await ledgers.read_ledger_metadata(tree, 7)
        assert (closed.last_entry_id, closed.length, version) == (3, 30, 1)  # never overwritten
    run(scenario())


def test_update_loop_is_bounded():
    async def scenario():
        tree = InMemoryMetadataStore()
        await ledgers.create_ledger_metadata(tree, 7, META)

        async def bump():
            data, version = await tree.get(ledger_path(7))
            await tree.set(ledger_path(7), data, version)

        racing = RacingStore(tree, bump, races=10)
        with pytest.raises(BadVersionError):
            await ledgers.update_ledger_metadata(racing, 7, lambda m: m.with_state(LedgerState.IN_RECOVERY),
                                                 attempts_max=3)
        assert racing.races_left == 7  # three rounds, then the last conflict is the caller's
        assert (await ledgers.read_ledger_metadata(tree, 7))[0].state is LedgerState.OPEN
    run(scenario())


def test_no_write_when_nothing_changes():
    async def scenario():
        tree = InMemoryMetadataStore()
        await ledgers.create_ledger_metadata(tree, 7, META)
        assert await ledgers.update_ledger_metadata(tree, 7, lambda m: None, attempts_max=1) == (META, 0)
        assert await ledgers.update_ledger_metadata(tree, 7, lambda m: m, attempts_max=1) == (META, 0)
        assert tree.stat(ledger_path(7)).version == 0
    run(scenario())


def test_writes_are_always_cas():
    async def scenario():
        tree = InMemoryMetadataStore()
        await ledgers.create_ledger_metadata(tree, 7, META)
        with pytest.raises(AssertionError, match="compare-and-set"):
            await ledgers.write_ledger_metadata(tree, 7, META.closed(-1, 0), -1)
    run(scenario())


def test_listing_walks_both_forms_and_skips_everything_else():
    async def scenario():
        tree = InMemoryMetadataStore()
        ids = [0, 16, 9_999_999_999, 10**10, 2**63 - 1, 123_456_789_012]
        for ledger_id in ids:
            await ledgers.create_ledger_metadata(tree, ledger_id, META)
        for other in ("/ledgers/available/readonly", "/ledgers/cookies/a:1", "/ledgers/INSTANCEID",
                      "/ledgers/idgen", "/ledgers/00/0000/junk", "/ledgers/00/abcd/L0001",
                      "/ledgers/000/0000/0000/0000/L0016",  # long form of a short id: not canonical
                      "/ledgers/underreplication/ledgers/00/0000/L0001"):
            await tree.create(other, make_parents=True)
        assert await ledgers.list_ledger_ids(tree) == sorted(ids)
        await ledgers.delete_ledger_metadata(tree, 16)
        assert 16 not in await ledgers.list_ledger_ids(tree)
        assert await ledgers.list_ledger_ids(InMemoryMetadataStore()) == []  # no /ledgers at all
    run(scenario())


def test_garbage_in_a_ledger_znode_names_the_ledger_and_path():
    async def scenario():
        tree = InMemoryMetadataStore()
        await tree.create(ledger_path(16), b"\x00garbage", make_parents=True)
        with pytest.raises(MetadataFormatError, match=r"ledger 16 \(/ledgers/00/0000/L0016\)"):
            await ledgers.read_ledger_metadata(tree, 16)
        with pytest.raises(NoNodeError):
            await ledgers.read_ledger_metadata(tree, 17)
    run(scenario())
