"""The auditor (autorecovery/auditor.py) over the in-memory metadata store, FakeBookies and a ManualClock:
election and takeover, lost bookies with and without the delay, merged marks, the check of all ledgers
(missing copies, limbo, gaps, multi-segment ledgers), the verification of the copies' contents (which entries,
damaged and differing copies, batches), the disable switch and the loop."""
from __future__ import annotations

import asyncio
import random

import pytest

from bksim.autorecovery.auditor import Auditor, holds_entry, missing_entries, required_entries, verifies_entry
from bksim.autorecovery.marks import UnderReplicationMarks
from bksim.broker.ledgers import LedgerService
from bksim.ledger.quorum import write_set_indexes
from bksim.metadata.ledger_manager import list_ledger_ids, read_ledger_metadata
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import CHECK_ALL_LEDGERS_CTIME, LEDGERS_ROOT, bookie_path, cookie_path
from bksim.formats.entry import decode_entry, encode_entry
from bksim.model.config import AutoRecoveryConfig, BrokerConfig, Config
from bksim.model.errors import BookieUnreachable, ConfigError, ConnectionLossError, SessionExpiredError
from bksim.model.status import StatusCode
from fakes.bookies import FakeBookies
from fakes.clock import WALL_EPOCH_MS, ManualClock
from helpers import wait_until_async

BOOKIES = [f"b{i}" for i in range(5)]
PW = b"pw"
DELAY_MS = 10_000


def run(coro):
    return asyncio.run(coro)


class DamageableBookies(FakeBookies):
    """FakeBookies whose reads of the (bookie, ledger, entry) copies in `io_errors` answer IO_ERROR (the bookie's
    own check of a damaged entry-log record), while ListEntries still lists them; the bookies in `silent` list
    their entries but give no answer to reads."""

    def __init__(self, ids) -> None:
        super().__init__(ids)
        self.io_errors: set[tuple[str, int, int]] = set()
        self.silent: set[str] = set()

    async def read_entries(self, bookie, ledger_id, entry_ids, *, fence=False, master_key=b""):
        if bookie in self.silent:
            raise BookieUnreachable(bookie, "deadline passed (fake)")
        out = await super().read_entries(bookie, ledger_id, entry_ids, fence=fence, master_key=master_key)
        return [(StatusCode.IO_ERROR, b"") if (bookie, ledger_id, entry_id) in self.io_errors else answer
                for entry_id, answer in zip(entry_ids, out)]


def flip_byte(data: bytes) -> bytes:
    """The entry with one payload byte flipped: its digest no longer matches."""
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF
    return bytes(damaged)


class World:
    """Five bookies (a cookie and a registration each), a broker's ledger client, auditor candidates."""

    def __init__(self, delay_ms: int = 0, verify_percentage: int = 0) -> None:
        self.store = InMemoryMetadataStore()
        self.fake = DamageableBookies(BOOKIES)
        self.clock = ManualClock()
        self.config = AutoRecoveryConfig(lost_bookie_recovery_delay_ms=delay_ms, read_batch_entries=8,
                                         ledger_verification_percentage=verify_percentage)
        self.registrations: dict[str, object] = {}
        self.service = LedgerService(store=self.store.session("broker"), transport=self.fake, rng=random.Random(7),
                                     clock=ManualClock(sleeps_advance=True),
                                     config=BrokerConfig(speculative_read_ms=50))
        self.lines: list[str] = []

    async def start(self) -> "World":
        for bookie in BOOKIES:
            await self.store.create(cookie_path(bookie), b"{}", make_parents=True)
            await self.register(bookie)
        return self

    async def register(self, bookie: str, read_only: bool = False) -> None:
        session = self.store.session(bookie)
        await session.create(bookie_path(bookie, read_only), b"{}", ephemeral=True, make_parents=True)
        self.registrations[bookie] = session

    def kill(self, bookie: str) -> None:
        """The bookie's registration goes (its session ends); its copies stay on the fake."""
        self.store.expire(self.registrations.pop(bookie))

    def candidate(self, owner: str) -> Auditor:
        session = self.store.session(owner)
        return Auditor(session, self.fake, UnderReplicationMarks(session, self.clock), self.clock, self.config,
                       owner, log=self.lines.append)

    async def ledger(self, entries: int, e: int = 3, qw: int = 2, qa: int = 2, close: bool = True) -> int:
        handle = await self.service.create_ledger(e, qw, qa, password=PW)
        await asyncio.gather(*[handle.append(b"entry-%d" % i) for i in range(entries)])
        if close:
            await self.service.close_ledger(handle.ledger_id, PW)
        return handle.ledger_id

    async def naming(self, bookies) -> dict[int, list[str]]:
        """{ledger id: the given bookies its segments name}, for the ledgers that name any."""
        out = {}
        for ledger_id in await list_ledger_ids(self.store):
            metadata, _ = await read_ledger_metadata(self.store, ledger_id)
            named = sorted({b for s in metadata.segments for b in s.ensemble} & set(bookies))
            if named:
                out[ledger_id] = named
        return out

    async def marked(self) -> dict[int, tuple[str, ...]]:
        marks = UnderReplicationMarks(self.store, self.clock)
        return {m.ledger_id: m.missing for m in await marks.list()}


async def ledgers(world: World, count: int = 8) -> list[int]:
    return [await world.ledger(10 + i) for i in range(count)]


# -- election ------------------------------------------------------------------------------------------------

def test_the_lowest_vote_is_the_auditor_and_the_next_takes_over_when_its_session_ends():
    async def main():
        w = await World().start()
        a, b = w.candidate("node-a"), w.candidate("node-b")
        vote = await a.elect()
        assert await a.elect() == vote  # one vote per candidate
        await b.elect()
        assert await a.is_auditor() and not await b.is_auditor()
        assert await a.current_auditor() == await b.current_auditor() == "node-a"
        w.store.expire(a.store)
        assert await b.is_auditor() and await b.current_auditor() == "node-b"
        c = w.candidate("node-c")
        assert not await c.is_auditor()  # no vote yet
        await c.elect()
        assert not await c.is_auditor() and await c.current_auditor() == "node-b"
    run(main())


def test_no_votes_no_auditor():
    async def main():
        w = await World().start()
        a = w.candidate("node-a")
        assert await a.current_auditor() is None and not await a.is_auditor()
    run(main())


# -- lost bookies --------------------------------------------------------------------------------------------

def test_a_lost_bookie_marks_exactly_the_ledgers_that_name_it():
    async def main():
        w = await World().start()
        await ledgers(w)
        expected = await w.naming(["b0"])
        assert 0 < len(expected) < 8  # the seed gives both kinds
        auditor = w.candidate("node-a")
        report = await auditor.check_bookies()
        assert report["lost"] == [] and not report["scanned"] and await w.marked() == {}
        w.kill("b0")
        report = await auditor.check_bookies()
        assert report["lost"] == ["b0"] and report["registered"] == BOOKIES[1:]
        assert report["marked"] == expected
        assert await w.marked() == {ledger_id: ("b0",) for ledger_id in expected}
        again = await auditor.check_bookies()  # nothing new: no scan
        assert again["lost"] == ["b0"] and not again["scanned"]
        full = await auditor.check_bookies(full=True)  # the periodic check scans whatever it saw before
        assert full["scanned"] and full["marked"] == expected
    run(main())


def test_a_lost_bookie_that_came_back_and_went_again_between_two_checks_is_scanned_again():
    async def main():
        w = await World().start()
        await ledgers(w)
        expected = await w.naming(["b0"])
        auditor = w.candidate("node-a")
        w.kill("b0")
        assert (await auditor.check_bookies())["marked"] == expected
        # b0 restarts with its copies, a worker finds them all there and removes the marks (the bookie is
        # kept), and b0 dies again: all between two checks, so the auditor never saw it registered
        await w.register("b0")
        marks = UnderReplicationMarks(w.store, w.clock)
        for mark in await marks.list():
            assert await marks.replicated(mark)
        w.kill("b0")
        report = await auditor.check_bookies()
        assert report["lost"] == ["b0"] and report["scanned"] and report["marked"] == expected
        assert await w.marked() == {ledger_id: ("b0",) for ledger_id in expected}
        again = await auditor.check_bookies()  # nothing happened since: no scan
        assert again["lost"] == ["b0"] and not again["scanned"]
        await w.register("b5")  # a registration the auditor sees is no reason to scan again
        assert not (await auditor.check_bookies())["scanned"]
    run(main())


def test_a_registered_bookie_that_restarted_between_two_checks_scans_only_if_a_bookie_is_lost():
    async def main():
        w = await World().start()
        await ledgers(w)
        auditor = w.candidate("node-a")
        await auditor.check_bookies()
        w.kill("b1")
        await w.register("b1")  # down and up again between two checks: nothing is lost
        report = await auditor.check_bookies()
        assert report["lost"] == [] and not report["scanned"] and await w.marked() == {}
        w.kill("b0")
        await auditor.check_bookies()
        w.kill("b1")
        await w.register("b1")  # the same unseen restart, while b0 is lost: b0's ledgers are marked again
        report = await auditor.check_bookies()
        assert report["lost"] == ["b0"] and report["scanned"]
        assert report["marked"] == await w.naming(["b0"])
    run(main())


def test_a_lost_bookie_waits_out_the_delay():
    async def main():
        w = await World(delay_ms=DELAY_MS).start()
        await ledgers(w)
        expected = await w.naming(["b0"])
        auditor = w.candidate("node-a")
        w.kill("b0")
        report = await auditor.check_bookies()
        assert report["lost"] == [] and report["waiting"] == {"b0": DELAY_MS}
        w.clock.advance(DELAY_MS - 1)
        report = await auditor.check_bookies()
        assert report["lost"] == [] and report["waiting"] == {"b0": 1} and await w.marked() == {}
        w.clock.advance(1)
        report = await auditor.check_bookies()
        assert report["lost"] == ["b0"] and report["marked"] == expected
        assert set(await w.marked()) == set(expected)
    run(main())


def test_a_bookie_back_within_the_delay_is_not_lost():
    async def main():
        w = await World(delay_ms=DELAY_MS).start()
        await ledgers(w)
        auditor = w.candidate("node-a")
        w.kill("b0")
        await auditor.check_bookies()
        w.clock.advance(DELAY_MS // 2)
        await w.register("b0")  # restarted
        report = await auditor.check_bookies()
        assert report["waiting"] == {} and report["lost"] == []
        w.clock.advance(DELAY_MS)
        report = await auditor.check_bookies(full=True)
        assert report["lost"] == [] and await w.marked() == {}
        w.kill("b0")  # gone again: the delay starts over
        assert (await auditor.check_bookies())["waiting"] == {"b0": DELAY_MS}
        w.clock.advance(DELAY_MS - 1)
        assert (await auditor.check_bookies())["waiting"] == {"b0": 1}
    run(main())


def test_a_read_only_bookie_is_not_lost():
    async def main():
        w = await World().start()
        await ledgers(w)
        auditor = w.candidate("node-a")
        w.kill("b0")
        await w.register("b0", read_only=True)
        report = await auditor.check_bookies()
        assert report["lost"] == [] and "b0" in report["registered"] and await w.marked() == {}
    run(main())


def test_a_second_lost_bookie_is_merged_into_the_marks():
    async def main():
        w = await World().start()
        await ledgers(w)
        auditor = w.candidate("node-a")
        w.kill("b0")
        await auditor.check_bookies()
        w.kill("b1")
        report = await auditor.check_bookies()
        assert report["lost"] == ["b0", "b1"] and report["scanned"]
        expected = await w.naming(["b0", "b1"])
        assert any(len(named) == 2 for named in expected.values())  # the seed gives a ledger naming both
        assert await w.marked() == {ledger_id: tuple(named) for ledger_id, named in expected.items()}
    run(main())


def test_a_lost_verdict_that_rested_on_a_bookie_registered_again_is_withdrawn_from_its_mark():
    # sim seed 764273: a worker found a ledger lost while a marked bookie was down for now; the auditor saw the
    # bookie registered again but left the verdict in the mark, and no worker claimed the ledger again in time:
    # it stayed reported lost with every entry on a registered bookie
    async def main():
        w = await World().start()
        await ledgers(w)
        auditor = w.candidate("node-a")
        w.kill("b0")
        w.kill("b1")
        await auditor.check_bookies()
        marks = UnderReplicationMarks(w.store, w.clock)
        both, gone_only, answered = [m for m in await marks.list() if m.missing == ("b0", "b1")][:3]
        await marks.set_lost(both, 2, "entries 0, 1: no copy; unregistered and silent: ['b0', 'b1']",
                             lost_on=["b0", "b1"])
        await marks.set_lost(gone_only, 1, "entry 4: no copy; unregistered and silent: ['b0']", lost_on=["b0"])
        await marks.set_lost(answered, 3, "entries 2, 5, 8: no copy")  # every replica answered NO_ENTRY
        kept = [await marks.get(gone_only.ledger_id), await marks.get(answered.ledger_id)]
        await w.register("b1")  # down for now, not lost: back with its copies
        report = await auditor.check_bookies()
        assert report["lost"] == ["b0"] and report["withdrawn"] == {both.ledger_id: ["b1"]}
        withdrawn = await marks.get(both.ledger_id)
        assert (withdrawn.missing, withdrawn.lost_entries, withdrawn.note, withdrawn.lost_on) == (("b0", "b1"), 0,
                                                                                                  "", ())
        assert [await marks.get(gone_only.ledger_id), await marks.get(answered.ledger_id)] == kept
        assert any("b1" in line and "withdrawn" in line for line in w.lines)
        assert (await auditor.check_bookies())["withdrawn"] == {}
    run(main())


class FailingReads:
    """A session whose reads of ledger metadata fail while `failing` is set (ZooKeeper did not answer)."""

    def __init__(self, inner):
        self._inner = inner
        self.failing = True

    def __getattr__(self, name):
        return getattr(self._inner, name)

    async def get(self, path):
        if self.failing and path.startswith(LEDGERS_ROOT + "/0"):
            raise ConnectionLossError(path, "no answer (test)")
        return await self._inner.get(path)


def test_a_scan_that_failed_halfway_is_repeated_at_the_next_check():
    async def main():
        w = await World().start()
        await ledgers(w)
        store = FailingReads(w.store.session("node-a"))
        auditor = Auditor(store, w.fake, UnderReplicationMarks(store, w.clock), w.clock, w.config, "node-a")
        w.kill("b0")
        with pytest.raises(ConnectionLossError):  # the error itself, not a task group's
            await auditor.check_bookies()
        store.failing = False
        report = await auditor.check_bookies()
        assert report["scanned"] and set(await w.marked()) == set(await w.naming(["b0"]))
    run(main())


def test_disabled_marks_nothing_until_enabled():
    async def main():
        w = await World().start()
        ids = await ledgers(w)
        auditor = w.candidate("node-a")
        await auditor.marks.disable()
        w.kill("b0")
        report = await auditor.check_bookies(full=True)
        assert report["disabled"] and report["lost"] == ["b0"] and not report["scanned"]
        bookie = (await read_ledger_metadata(w.store, ids[0]))[0].write_set(0)[0]
        w.fake[bookie].entries[ids[0]].pop(0)
        assert (await auditor.check_all_ledgers())["disabled"]
        assert await w.marked() == {}
        await auditor.marks.enable()
        report = await auditor.check_bookies()
        assert report["scanned"] and set(await w.marked()) == set(await w.naming(["b0"]))
    run(main())


# -- the check of all ledgers ----------------------------------------------------------------------------------

def test_a_healthy_cluster_has_nothing_to_mark():
    async def main():
        w = await World().start()
        await ledgers(w)
        await w.ledger(0)  # closed empty
        checked: list[tuple[int, int]] = []
        report = await w.candidate("node-a").check_all_ledgers(on_checked=lambda done, total: checked.append(
            (done, total)))
        assert report["ledgers"] == report["checked"] == 9
        assert checked == [(i, 9) for i in range(1, 10)]  # a command's progress: each ledger looked at, of all
        assert report["marked"] == {} and report["unreachable"] == {} and report["errors"] == []
        assert await w.marked() == {}
    run(main())


def test_a_missing_copy_marks_that_ledger_with_that_bookie_only():
    async def main():
        w = await World().start()
        ids = await ledgers(w)
        target = ids[3]
        metadata, _ = await read_ledger_metadata(w.store, target)
        bookie = metadata.write_set(5)[1]
        del w.fake[bookie].entries[target][5]
        report = await w.candidate("node-a").check_all_ledgers()
        assert report["marked"] == {target: {bookie: 1}}
        assert await w.marked() == {target: (bookie,)}
    run(main())


def test_a_gap_and_a_lost_ledger_are_counted_per_bookie():
    async def main():
        w = await World().start()
        ids = await ledgers(w)
        gap, gone = ids[1], ids[2]
        md_gap, _ = await read_ledger_metadata(w.store, gap)
        holder = md_gap.ensemble[0]
        held = sorted(w.fake[holder].entries[gap])
        for entry_id in held[1:-1]:  # keep the first and last: only a list of entries finds the hole
            del w.fake[holder].entries[gap][entry_id]
        md_gone, _ = await read_ledger_metadata(w.store, gone)
        formatted = md_gone.ensemble[2]
        count = len(w.fake[formatted].entries.pop(gone))
        w.fake[formatted].keys.pop(gone)  # the bookie never heard of the ledger: NO_LEDGER
        report = await w.candidate("node-a").check_all_ledgers()
        assert report["marked"][gap] == {holder: len(held) - 2}
        assert report["marked"][gone] == {formatted: count}
        assert set(report["marked"]) == {gap, gone}
    run(main())


def test_a_limbo_bookie_is_missing_everything_it_must_hold():
    async def main():
        w = await World().start()
        await ledgers(w)
        w.fake["b2"].error = StatusCode.UNKNOWN_STATE  # a re-formatted bookie: cannot say what it lost
        report = await w.candidate("node-a").check_all_ledgers()
        expected = await w.naming(["b2"])
        assert set(report["marked"]) == set(expected)
        assert all(list(missing) == ["b2"] for missing in report["marked"].values())
        for ledger_id, missing in report["marked"].items():
            metadata, _ = await read_ledger_metadata(w.store, ledger_id)
            assert missing["b2"] == sum(1 for e in range(metadata.last_entry_id + 1) if "b2" in metadata.write_set(e))
    run(main())


def test_an_unreachable_or_erring_bookie_is_reported_not_marked():
    async def main():
        w = await World().start()
        await ledgers(w)
        w.fake["b1"].down = True  # registered but not answering: the bookie check decides
        w.fake["b3"].error = StatusCode.IO_ERROR  # the truth is unknown: never a "no"
        report = await w.candidate("node-a").check_all_ledgers()
        assert report["marked"] == {} and await w.marked() == {}
        assert set(report["unreachable"]) == set(await w.naming(["b1"]))
        assert len(report["errors"]) == len(await w.naming(["b3"])) > 0
    run(main())


def test_an_unregistered_bookie_is_left_to_the_bookie_check():
    async def main():
        w = await World().start()
        ids = await ledgers(w)
        w.kill("b4")
        w.fake["b4"].entries.clear()
        report = await w.candidate("node-a").check_all_ledgers()
        assert report["marked"] == {} and report["checked"] == len(ids)
    run(main())


def test_open_ledgers_are_not_checked():
    async def main():
        w = await World().start()
        open_id = await w.ledger(10, close=False)
        metadata, _ = await read_ledger_metadata(w.store, open_id)
        w.fake[metadata.ensemble[0]].entries[open_id].clear()
        report = await w.candidate("node-a").check_all_ledgers()
        assert report["ledgers"] == 1 and report["checked"] == 0 and report["marked"] == {}
    run(main())


def test_each_segment_is_checked_against_its_own_ensemble():
    async def main():
        w = await World().start()
        handle = await w.service.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*[handle.append(b"a%d" % i) for i in range(10)])
        replaced = handle.metadata.ensemble[1]
        w.fake[replaced].down = True
        await asyncio.gather(*[handle.append(b"b%d" % i) for i in range(10)])
        metadata = await w.service.close_ledger(handle.ledger_id, PW)
        assert len(metadata.segments) == 2 and replaced not in metadata.segments[1].ensemble
        w.fake[replaced].down = False  # it holds the first segment's entries only, as it must
        auditor = w.candidate("node-a")
        assert (await auditor.check_all_ledgers())["marked"] == {}
        newcomer = next(b for b in metadata.segments[1].ensemble if b not in metadata.segments[0].ensemble)
        second_first = metadata.segments[1].first_entry_id
        del w.fake[newcomer].entries[handle.ledger_id][second_first]
        assert (await auditor.check_all_ledgers())["marked"] == {handle.ledger_id: {newcomer: 1}}
    run(main())


# -- the verification of the copies ------------------------------------------------------------------------------

def test_the_entries_verified_are_a_fixed_share_chosen_by_their_ids():
    ids = [(ledger_id, entry_id) for ledger_id in range(20) for entry_id in range(500)]
    assert not any(verifies_entry(lid, eid, 0) for lid, eid in ids)
    assert all(verifies_entry(lid, eid, 100) for lid, eid in ids)
    chosen = {p: {(lid, eid) for lid, eid in ids if verifies_entry(lid, eid, p)} for p in (10, 30, 70)}
    for p, picked in chosen.items():  # about p% of them, and the same ones every time it is asked
        assert abs(len(picked) / len(ids) - p / 100) < 0.02, (p, len(picked))
        assert picked == {(lid, eid) for lid, eid in ids if verifies_entry(lid, eid, p)}
    assert chosen[10] < chosen[30] < chosen[70]  # a larger share verifies what a smaller one did, and more
    per_ledger = [frozenset(eid for lid, eid in chosen[30] if lid == ledger) for ledger in range(20)]
    assert len(set(per_ledger)) == 20  # not the same entry ids in every ledger


def test_holds_entry_looks_the_id_up_in_the_ranges():
    ranges = [(0, 3), (7, 7), (10, 20)]
    assert [e for e in range(25) if holds_entry(ranges, e)] == [0, 1, 2, 3, 7, *range(10, 21)]
    assert not holds_entry([], 0)


def test_the_percentage_option_is_validated():
    for bad in (-1, 101):
        with pytest.raises(ConfigError, match=rf"autorecovery.ledger_verification_percentage \({bad}\) must be "
                                              r"within 0..100"):
            Config(autorecovery=AutoRecoveryConfig(ledger_verification_percentage=bad)).validate()
    for good in (0, 100):
        Config(autorecovery=AutoRecoveryConfig(ledger_verification_percentage=good)).validate()


async def damage(w: World, ledger_id: int, entry_id: int, position: int = 1) -> str:
    """Flip a byte of the copy of `entry_id` on the bookie at `position` of its write set; that bookie."""
    metadata, _ = await read_ledger_metadata(w.store, ledger_id)
    bookie = metadata.write_set(entry_id)[position]
    copies = w.fake[bookie].entries[ledger_id]
    copies[entry_id] = flip_byte(copies[entry_id])
    return bookie


def test_a_damaged_copy_the_bookie_still_lists_is_found_only_by_verification_and_marks_that_bookie():
    async def main():
        w = await World().start()
        ids = await ledgers(w)
        target = ids[4]
        bookie = await damage(w, target, 6)
        unverified = await w.candidate("node-a").check_all_ledgers()
        assert unverified["marked"] == {} and unverified["copies_verified"] == 0  # the listing sees nothing
        assert all(not b.read_calls for b in w.fake.bookies.values())
        report = await w.candidate("node-a").check_all_ledgers(verify_percentage=100)
        assert report["marked"] == {target: {bookie: 1}} and report["damaged"] == {target: {bookie: 1}}
        assert await w.marked() == {target: (bookie,)}
        total = 0
        for ledger_id in ids:
            metadata, _ = await read_ledger_metadata(w.store, ledger_id)
            total += (metadata.last_entry_id + 1) * metadata.write_quorum_size
        assert report["copies_verified"] == total - 1 and report["copies_unjudged"] == 0
        assert any(f"entry 6 on {bookie}: digest mismatch" in line for line in w.lines), w.lines
    run(main())


def test_a_copy_answered_io_error_or_failing_its_digest_is_missing_on_that_bookie():
    async def main():
        w = await World(verify_percentage=100).start()  # the configured percentage, when none is given
        ids = await ledgers(w, 3)
        md0, _ = await read_ledger_metadata(w.store, ids[0])
        md1, _ = await read_ledger_metadata(w.store, ids[1])
        erring, vanished = md0.write_set(2)[0], md1.write_set(5)[1]
        w.fake.io_errors.add((erring, ids[0], 2))
        w.fake[vanished].entries[ids[1]][5] = flip_byte(w.fake[vanished].entries[ids[1]][5])
        report = await w.candidate("node-a").check_all_ledgers()
        assert report["verify_percentage"] == 100
        assert report["marked"] == {ids[0]: {erring: 1}, ids[1]: {vanished: 1}}
    run(main())


def test_only_the_chosen_share_is_read_in_batches_and_a_damaged_entry_outside_it_is_not_seen():
    async def main():
        w = await World().start()
        lid = await w.ledger(120)
        metadata, _ = await read_ledger_metadata(w.store, lid)
        chosen = [e for e in range(120) if verifies_entry(lid, e, 30)]
        skipped = next(e for e in range(120) if e not in chosen)
        await damage(w, lid, skipped, 0)
        report = await w.candidate("node-a").check_all_ledgers(verify_percentage=30)
        assert report["marked"] == {} and report["copies_verified"] == 2 * len(chosen)
        for bookie in metadata.ensemble:
            calls = [ids for ledger_id, ids, _ in w.fake[bookie].read_calls if ledger_id == lid]
            read = sorted(e for ids in calls for e in ids)
            assert read == [e for e in chosen if bookie in metadata.write_set(e)]
            # batched: at most read_batch_entries ids a call, one call per bookie and batch of the chosen ids
            assert all(len(ids) <= w.config.read_batch_entries for ids in calls)
            assert len(calls) <= -(-len(chosen) // w.config.read_batch_entries)
        bookie = await damage(w, lid, chosen[3], 1)
        report = await w.candidate("node-a").check_all_ledgers(verify_percentage=30)
        assert report["marked"] == {lid: {bookie: 1}}
    run(main())


def test_a_copy_with_a_valid_digest_but_other_bytes_is_marked_when_the_others_agree():
    async def main():
        w = await World().start()
        handle = await w.service.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*[handle.append(b"entry-%d" % i) for i in range(9)])
        await w.service.close_ledger(handle.ledger_id, PW)
        lid = handle.ledger_id
        metadata, _ = await read_ledger_metadata(w.store, lid)
        odd = metadata.write_set(4)[2]
        good = decode_entry(w.fake[odd].entries[lid][4])
        forged = encode_entry(lid, 4, good.last_add_confirmed, good.ledger_length, b"something else")
        w.fake[odd].entries[lid][4] = forged  # its digest verifies: only the other copies tell
        report = await w.candidate("node-a").check_all_ledgers(verify_percentage=100)
        assert report["marked"] == {lid: {odd: 1}} and report["errors"] == []
    run(main())


def test_two_verified_copies_that_differ_are_reported_not_marked():
    async def main():
        w = await World().start()
        lid = await w.ledger(6)  # Qw = 2: which copy is right is not known
        metadata, _ = await read_ledger_metadata(w.store, lid)
        one = metadata.write_set(2)[0]
        good = decode_entry(w.fake[one].entries[lid][2])
        w.fake[one].entries[lid][2] = encode_entry(lid, 2, good.last_add_confirmed, good.ledger_length, b"other")
        report = await w.candidate("node-a").check_all_ledgers(verify_percentage=100)
        assert report["marked"] == {} and await w.marked() == {}
        assert report["errors"] == [f"ledger {lid}: entry 2: verified copies differ with no majority"]
    run(main())


def test_a_copy_the_listing_already_misses_is_counted_once_and_an_unanswering_bookie_is_not_judged():
    async def main():
        w = await World().start()
        lid = await w.ledger(12)
        metadata, _ = await read_ledger_metadata(w.store, lid)
        holder = metadata.write_set(3)[0]
        del w.fake[holder].entries[lid][3]
        report = await w.candidate("node-a").check_all_ledgers(verify_percentage=100)
        assert report["marked"] == {lid: {holder: 1}} and report["damaged"] == {}
        w.fake.silent.add(next(b for b in metadata.ensemble if b != holder))
        report = await w.candidate("node-a").check_all_ledgers(verify_percentage=100)
        assert report["marked"] == {lid: {holder: 1}} and report["copies_unjudged"] > 0
    run(main())


def test_required_and_missing_entries_agree_with_the_write_sets():
    rng = random.Random(3)
    for _ in range(300):
        e = rng.randint(1, 6)
        qw = rng.randint(1, e)
        first = rng.randint(0, 20)
        last = first + rng.randint(-1, 40)
        index = rng.randrange(e)
        must = {x for x in range(first, last + 1) if index in write_set_indexes(x, e, qw)}
        assert required_entries(first, last, index, e, qw) == len(must)
        held_ids = sorted(x for x in range(0, last + 5) if rng.random() < 0.6)
        ranges: list[tuple[int, int]] = []
        for x in held_ids:
            if ranges and x == ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], x)
            else:
                ranges.append((x, x))
        assert missing_entries(first, last, ranges, index, e, qw) == len(must - set(held_ids))


# -- the loop --------------------------------------------------------------------------------------------------

def test_the_loop_checks_as_auditor_and_hands_over_when_its_session_ends():
    async def main():
        w = await World().start()
        ids = await ledgers(w)
        a, b = w.candidate("node-a"), w.candidate("node-b")
        stop = asyncio.Event()
        task_a = asyncio.create_task(a.run(stop))
        await wait_until_async(lambda: a.last_check_all is not None, 5)  # never ran on this cluster: at once
        task_b = asyncio.create_task(b.run(stop))
        await wait_until_async(lambda: b.vote is not None, 5)
        assert a.leading and not b.leading and b.last_bookie_check is None
        assert a.last_check_all["checked"] == len(ids)
        assert (await w.store.get(CHECK_ALL_LEDGERS_CTIME))[0] == str(WALL_EPOCH_MS).encode()

        w.kill("b0")
        w.clock.advance(w.config.bookie_check_interval_ms)
        await wait_until_async(lambda: a.last_bookie_check["lost"] == ["b0"], 5)
        assert set(await w.marked()) == set(await w.naming(["b0"]))

        # the operators' check-all from another process: any candidate may ask
        metadata, _ = await read_ledger_metadata(w.store, ids[0])
        victim = next(x for x in metadata.write_set(1) if x != "b0")
        del w.fake[victim].entries[ids[0]][1]
        checks = a.last_check_all
        await b.trigger_check_all()
        w.clock.advance(w.config.bookie_check_interval_ms)
        await wait_until_async(lambda: a.last_check_all is not checks, 5)
        assert a.last_check_all["marked"][ids[0]] == {victim: 1}
        assert victim in (await w.marked())[ids[0]]

        w.store.expire(a.store)
        w.clock.advance(w.config.bookie_check_interval_ms)
        with pytest.raises(SessionExpiredError):
            await task_a
        await wait_until_async(lambda: b.leading and b.last_bookie_check is not None, 5)
        assert b.last_bookie_check["lost"] == ["b0"]  # a new auditor starts with a full check
        stop.set()
        await task_b
        assert any("node-b is the auditor" in line for line in w.lines)
    run(main())


def test_the_loop_logs_an_operating_error_and_tries_again():
    async def main():
        w = await World().start()
        await ledgers(w, 3)
        store = FailingReads(w.store.session("node-a"))
        lines: list[str] = []
        auditor = Auditor(store, w.fake, UnderReplicationMarks(store, w.clock), w.clock, w.config, "node-a",
                          log=lines.append)
        stop = asyncio.Event()
        task = asyncio.create_task(auditor.run(stop))
        await wait_until_async(lambda: any("ConnectionLossError" in line for line in lines), 5)
        assert auditor.last_check_all is None
        store.failing = False
        w.clock.advance(w.config.bookie_check_interval_ms)
        await wait_until_async(lambda: auditor.last_check_all is not None, 5)
        assert auditor.last_check_all["checked"] == 3
        stop.set()
        await task
    run(main())


def test_a_trigger_in_the_auditors_process_wakes_it_at_once():
    async def main():
        w = await World().start()
        await ledgers(w, 2)
        a = w.candidate("node-a")
        stop = asyncio.Event()
        task = asyncio.create_task(a.run(stop))
        await wait_until_async(lambda: a.last_check_all is not None, 5)
        first = a.last_check_all
        await a.trigger_check_all()  # no clock advance: the trigger wakes the loop
        await wait_until_async(lambda: a.last_check_all is not first, 5)
        stop.set()
        await task  # stop ends the wait at once too
    run(main())
