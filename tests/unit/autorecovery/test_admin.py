"""The operators' side of autorecovery (autorecovery/admin.py) over the in-memory metadata store, FakeBookies and a
ManualClock: decommission's refusals (nothing changed), its bounded wait, its end with a replication worker
running; one ledger's replicas; the status and the mark rows; the check of all ledgers run by the command with a
percentage of its own."""
from __future__ import annotations

import argparse
import asyncio
import random

import pytest

from bksim.autorecovery import admin
from bksim.autorecovery.auditor import Auditor
from bksim.autorecovery.marks import UnderReplicationMarks
from bksim.autorecovery.worker import ReplicationWorker
from bksim.broker.ledgers import LedgerService
from bksim.cli import autorecovery_cmd
from bksim.metadata.ledger_manager import read_ledger_metadata
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path, cookie_path
from bksim.model.config import AutoRecoveryConfig, BrokerConfig
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock

BOOKIES = [f"b{i}" for i in range(5)]
PW = b"pw"


class World:
    def __init__(self) -> None:
        self.store = InMemoryMetadataStore()
        self.fake = FakeBookies(BOOKIES)
        self.clock = ManualClock(sleeps_advance=True)
        self.config = AutoRecoveryConfig()
        self.sessions: dict[str, object] = {}
        self.service = LedgerService(store=self.store.session("broker"), transport=self.fake, rng=random.Random(3),
                                     clock=ManualClock(sleeps_advance=True), config=BrokerConfig())
        self.marks = UnderReplicationMarks(self.store, self.clock)
        self.lines: list[str] = []

    async def start(self) -> "World":
        for bookie in BOOKIES:
            await self.store.create(cookie_path(bookie), b"{}", make_parents=True)
            session = self.store.session(bookie)
            await session.create(bookie_path(bookie), b"{}", ephemeral=True, make_parents=True)
            self.sessions[bookie] = session
        return self

    def kill(self, bookie: str) -> None:
        self.store.expire(self.sessions.pop(bookie))
        self.fake[bookie].down = True

    def auditor(self, owner: str = "admin") -> Auditor:
        return Auditor(self.store, self.fake, self.marks, self.clock, self.config, owner, log=self.lines.append)

    async def ledger(self, entries: int) -> int:
        handle = await self.service.create_ledger(3, 2, 2, password=PW)
        await asyncio.gather(*[handle.append(b"entry-%d" % i) for i in range(entries)])
        await self.service.close_ledger(handle.ledger_id, PW)
        return handle.ledger_id

    async def decommission(self, bookie: str, timeout_ms: float = 60_000) -> dict:
        return await admin.decommission(self.store, self.marks, self.auditor(), self.clock, bookie,
                                        timeout_ms=timeout_ms, progress=self.lines.append)


def run(coro):
    return asyncio.run(coro)


def test_decommission_refuses_a_registered_and_an_unknown_bookie_and_changes_nothing():
    async def scenario():
        w = await World().start()
        lid = await w.ledger(10)
        with pytest.raises(admin.DecommissionError, match="is registered \\(writable\\): stop it first"):
            await w.decommission("b0")
        with pytest.raises(admin.DecommissionError, match="unknown bookie b9: no cookie"):
            await w.decommission("b9")
        assert await w.marks.list() == []
        assert await w.store.exists(cookie_path("b0")) is not None
        return lid
    run(scenario())


def test_decommission_without_workers_gives_up_at_its_bound_and_keeps_the_cookie():
    async def scenario():
        w = await World().start()
        lid = await w.ledger(30)
        gone = (await read_ledger_metadata(w.store, lid))[0].segments[0].ensemble[0]
        w.kill(gone)
        with pytest.raises(admin.DecommissionError, match="not decommissioned within 5 s"):
            await w.decommission(gone, timeout_ms=5_000)
        assert [(m.ledger_id, m.missing) for m in await w.marks.list()] == [(lid, (gone,))]
        assert await w.store.exists(cookie_path(gone)) is not None
        assert any("1 ledgers name" in line for line in w.lines), w.lines
    run(scenario())


def test_decommission_ends_once_the_workers_replaced_the_bookie_and_deletes_its_cookie():
    async def scenario():
        w = await World().start()
        ledgers = [await w.ledger(40) for _ in range(4)]
        counts = {b: 0 for b in BOOKIES}
        for lid in ledgers:
            for b in (await read_ledger_metadata(w.store, lid))[0].segments[0].ensemble:
                counts[b] += 1
        gone = max(counts, key=counts.get)
        w.kill(gone)
        worker = ReplicationWorker(store=w.store, transport=w.fake, ledgers=w.service, marks=w.marks,
                                   clock=w.clock, rng=random.Random(1), config=w.config, owner_id="worker")
        stop = asyncio.Event()
        copying = asyncio.create_task(worker.run(stop))
        done = await w.decommission(gone)
        stop.set()
        await copying
        assert done["bookie"] == gone and len(done["marked"]) == counts[gone]
        assert await admin.ledgers_naming(w.store, gone) == [] and await w.marks.list() == []
        assert await w.store.exists(cookie_path(gone)) is None
        for lid in ledgers:
            doc = await admin.replicas(w.store, w.fake, lid)
            rows = [r for s in doc["segments"] for r in s["replicas"]]
            assert all(r["status"] == "OK" and r["missing"] == 0 for r in rows), rows
    run(scenario())


def test_replicas_shows_what_each_bookie_holds_and_lacks():
    async def scenario():
        w = await World().start()
        lid = await w.ledger(12)
        metadata, _ = await read_ledger_metadata(w.store, lid)
        first, second, third = metadata.segments[0].ensemble
        del w.fake[first].entries[lid][3]  # index 0 holds the entries e with e % 3 in (0, 2): 0, 2, 3, 5, 6, ...
        w.fake[third].down = True
        doc = await admin.replicas(w.store, w.fake, lid)
        assert (doc["state"], doc["last_entry_id"], len(doc["segments"])) == ("CLOSED", 11, 1)
        rows = {r["bookie"]: r for r in doc["segments"][0]["replicas"]}
        assert rows[first]["holds"] == [[0, 0], [2, 2], [5, 6], [8, 9], [11, 11]] and rows[first]["missing"] == 1
        assert (rows[first]["should_hold"], rows[first]["holds_count"]) == (8, 7)
        assert rows[second]["missing"] == 0 and rows[second]["should_hold"] == 8
        assert rows[third]["status"] == "UNREACHABLE" and rows[third]["missing"] is None
    run(scenario())


def test_status_names_the_auditor_the_marks_and_the_lost_ledgers():
    async def scenario():
        w = await World().start()
        assert (await admin.status(w.store, w.marks, w.clock))["auditor"] is None
        candidate = w.auditor("b1")
        await candidate.elect()
        lid = await w.ledger(5)
        mark = await w.marks.mark(lid, ["b4"])
        await w.marks.set_lost(mark, 2, "entries 0, 3: no surviving replica")
        await w.marks.claim(lid, "b2")
        w.clock.advance(1_500)
        doc = await admin.status(w.store, w.marks, w.clock)
        assert (doc["auditor"], doc["candidates"], doc["disabled"]) == ("b1", ["b1"], False)
        assert (doc["underreplicated"], doc["lost_ledgers"], doc["claimed"]) == (1, [lid], {lid: "b2"})
        assert doc["marks"][0] | {"note": ""} == {"ledger_id": lid, "missing": ["b4"], "claimed_by": "b2",
                                                  "ctime_ms": mark.ctime_ms, "age_ms": 1_500, "lost_entries": 2,
                                                  "note": ""}
        assert doc["bookies"]["missing"] == [] and doc["check_all_ctime_ms"] is None
        await w.marks.disable()
        assert (await admin.status(w.store, w.marks, w.clock))["disabled"] is True
    run(scenario())


def test_check_all_verifies_the_percentage_asked_for_over_the_configured_one_and_marks_a_damaged_copy():
    async def scenario():
        w = await World().start()  # ledger_verification_percentage 0 in the configuration
        lid = await w.ledger(12)
        metadata, _ = await read_ledger_metadata(w.store, lid)
        bookie = metadata.write_set(5)[0]
        stored = bytearray(w.fake[bookie].entries[lid][5])
        stored[-1] ^= 0xFF
        w.fake[bookie].entries[lid][5] = bytes(stored)
        assert (await w.auditor().check_all_ledgers())["marked"] == {}
        report = await admin.check_all(w.auditor(), 100)
        assert report["verify_percentage"] == 100 and report["marked"] == {lid: {bookie: 1}}
        assert report["damaged"] == {lid: {bookie: 1}} and report["copies_verified"] == 2 * 12 - 1
        assert [(m.ledger_id, m.missing) for m in await w.marks.list()] == [(lid, (bookie,))]
    run(scenario())


def test_the_check_all_command_takes_a_percentage_within_0_to_100():
    parser = argparse.ArgumentParser()
    autorecovery_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["autorecovery", "check-all", "--verify-percentage", "25", "--json"])
    assert (args.verify_percentage, args.json, args.func) == (25, True, autorecovery_cmd.cmd_check_all)
    assert parser.parse_args(["autorecovery", "check-all"]).verify_percentage is None
    for bad in ("101", "-1", "ten"):
        with pytest.raises(SystemExit):
            parser.parse_args(["autorecovery", "check-all", "--verify-percentage", bad])
