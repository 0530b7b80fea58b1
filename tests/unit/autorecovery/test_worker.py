"""The replication worker (autorecovery/worker.py) over the in-memory metadata store, FakeBookies (an in-memory
fake of the bookie transport) and a ManualClock on which sleeps just let time pass. Each test writes ledgers
through the broker's ledger client, loses a bookie (down and unregistered), marks the ledger, and checks what
one claim (`run_once`) leaves behind: the bytes on every replica, the metadata, the mark and its lock. A marked
bookie that lists everything is kept only when its copies verify; a damaged one is never the source of a copy."""
from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from bksim.autorecovery.marks import UnderReplicationMarks
from bksim.autorecovery.worker import (DEFERRED, DELETED, FAILED, LOST, REMARKED, REPLICATED, ReplicationWorker,
                                       TokenBucket)
from bksim.broker.ledgers import LedgerService
from bksim.formats.entry import decode_entry, master_key
from bksim.ledger.quorum import write_set_indexes
from bksim.metadata.ledger_manager import read_ledger_metadata, update_ledger_metadata
from bksim.metadata.ledger_metadata import LedgerState
from bksim.metadata.memory import InMemoryMetadataStore
from bksim.metadata.paths import bookie_path, ledger_path
from bksim.model.config import AutoRecoveryConfig, BrokerConfig
from bksim.model.errors import BookieUnreachable
from fakes.bookies import FakeBookies
from fakes.clock import ManualClock
from helpers import wait_until_async

PW = b"secret"
BOOKIES = [f"b{i}" for i in range(6)]
CONFIG = AutoRecoveryConfig(open_ledger_rereplication_grace_ms=30_000, worker_backoff_ms=5_000,
                            lost_ledger_retry_ms=60_000, read_batch_entries=8,
                            rereplication_bytes_per_s_max=1 << 30)


class HookedBookies(FakeBookies):
    """FakeBookies that run `after_add(bookie)` once, after the next add call to a bookie in `hook_bookies`."""

    def __init__(self, ids) -> None:
        super().__init__(ids)
        self.after_add = None
        self.hook_bookies: set[str] = set()

    async def add(self, bookie, entries):
        out = await super().add(bookie, entries)
        hook = self.after_add
        if hook is not None and bookie in self.hook_bookies:
            self.after_add = None
            await hook(bookie)
        return out


class World:
    async def start(self, bookies=BOOKIES, config=CONFIG, clock=None) -> "World":
        self.store = InMemoryMetadataStore()
        self.registrations = self.store.session("bookies")
        for b in bookies:
            await self.registrations.create(bookie_path(b), b"{}", ephemeral=True, make_parents=True)
        self.fake = HookedBookies(bookies)
        self.clock = clock or ManualClock(sleeps_advance=True)
        self.writer = LedgerService(store=self.store.session("broker"), transport=self.fake, rng=random.Random(1),
                                    clock=self.clock, config=BrokerConfig(speculative_read_ms=50))
        session = self.store.session("worker")
        self.lines: list[str] = []
        self.worker_ledgers = LedgerService(store=session, transport=self.fake, rng=random.Random(2),
                                            clock=self.clock, config=BrokerConfig(speculative_read_ms=50),
                                            log=self.lines.append)
        self.marks = UnderReplicationMarks(session, self.clock)
        self.worker = ReplicationWorker(store=session, transport=self.fake, ledgers=self.worker_ledgers,
                                        marks=self.marks, clock=self.clock, rng=random.Random(3), config=config,
                                        owner_id="worker-1", log=self.lines.append)
        self.config = config
        return self

    def another_worker(self, owner_id: str) -> ReplicationWorker:
        """A second worker, in a process of its own (its own session, ledger client and memory)."""
        session = self.store.session(owner_id)
        ledgers = LedgerService(store=session, transport=self.fake, rng=random.Random(4), clock=self.clock,
                                config=BrokerConfig(speculative_read_ms=50), log=self.lines.append)
        return ReplicationWorker(store=session, transport=self.fake, ledgers=ledgers,
                                 marks=UnderReplicationMarks(session, self.clock), clock=self.clock,
                                 rng=random.Random(5), config=self.config, owner_id=owner_id, log=self.lines.append)

    async def ledger(self, e, qw, qa, entries, *, close=True):
        handle = await self.writer.create_ledger(e, qw, qa, password=PW)
        await asyncio.gather(*[handle.append(b"p%03d" % i) for i in range(entries)])
        if close:
            await self.writer.close_ledger(handle.ledger_id, PW)
        return handle

    async def lose(self, bookie):
        """The bookie dies for good: down, its registration gone."""
        self.fake[bookie].down = True
        await self.registrations.delete(bookie_path(bookie))

    def copies(self, ledger_id):
        """entry id -> the bytes every bookie holds of it (one value when all copies agree)."""
        out: dict[int, set[bytes]] = {}
        for b in self.fake.bookies.values():
            for entry_id, data in b.entries.get(ledger_id, {}).items():
                out.setdefault(entry_id, set()).add(data)
        return out

    async def metadata(self, ledger_id):
        return (await read_ledger_metadata(self.store, ledger_id))[0]

    async def assert_fully_replicated(self, ledger_id, entries, lost_bookie):
        """Every entry is on all Qw bookies of its write set in the metadata now stored, byte-identical, and
        no segment names the lost bookie."""
        md = await self.metadata(ledger_id)
        assert all(lost_bookie not in s.ensemble for s in md.segments), md.segments
        copies = self.copies(ledger_id)
        for entry_id in range(entries):
            [data] = copies[entry_id]  # identical bytes wherever the entry lies
            for b in md.write_set(entry_id):
                assert self.fake[b].entries[ledger_id][entry_id] == data, (entry_id, b)


def run(coro):
    return asyncio.run(coro)


def outcome(line):
    return line.split(": ", 2)[1]


def test_a_closed_ledger_with_a_lost_bookie_is_copied_back_to_qw_replicas_and_its_mark_removed():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 30)
        lid = h.ledger_id
        victim = h.metadata.ensemble[1]
        before = w.copies(lid)
        for b in BOOKIES:  # every bookie knows the ledger fenced and its key: only RECOVERY_ADD with the key copies
            w.fake[b].fenced.add(lid)
            w.fake[b].keys[lid] = master_key(PW)
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        await w.assert_fully_replicated(lid, 30, victim)
        md = await w.metadata(lid)
        assert md.state is LedgerState.CLOSED and (md.last_entry_id, md.length) == (29, h.metadata.length)
        [replacement] = set(md.ensemble) - set(h.metadata.ensemble)
        assert w.copies(lid) == before  # one value per entry, the bytes written
        assert sorted(w.fake[replacement].entries[lid]) == sorted(w.fake[victim].entries[lid])
        assert await w.marks.get(lid) is None and await w.marks.lock_owner(lid) is None
        assert await w.worker.run_once() is None  # nothing left to claim
        assert w.worker.statistics()["entries_copied"] == 20  # E=3 Qw=2: 2 of every 3 entries had the victim
    run(main())


def test_striping_copies_only_the_entries_whose_write_set_held_the_lost_bookie_in_batches():
    async def main():
        w = await World().start()
        h = await w.ledger(5, 2, 2, 50)
        lid = h.ledger_id
        index = 3
        victim = h.metadata.ensemble[index]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        assert outcome(await w.worker.run_once()) == REPLICATED
        md = await w.metadata(lid)
        replacement = md.ensemble[index]
        expected = [e for e in range(50) if index in write_set_indexes(e, 5, 2)]
        assert len(expected) == 20 and sorted(w.fake[replacement].entries[lid]) == expected
        assert w.fake[replacement].adds == 20
        reads = [ids for b in md.ensemble for (ledger, ids, _) in w.fake[b].read_calls if ledger == lid]
        assert reads and max(len(ids) for ids in reads) <= CONFIG.read_batch_entries
        assert sum(len(ids) for ids in reads) == 20  # each entry read once, from one surviving replica
        await w.assert_fully_replicated(lid, 50, victim)
    run(main())


def test_only_the_segments_that_name_the_lost_bookie_are_copied():
    async def main():
        w = await World().start()
        h = await w.writer.create_ledger(3, 3, 2, password=PW)
        lid = h.ledger_id
        await asyncio.gather(*[h.append(b"a%d" % i) for i in range(10)])
        first = h.metadata.ensemble
        w.fake[first[0]].down = True  # the writer replaces it itself: a second segment without it
        await asyncio.gather(*[h.append(b"b%d" % i) for i in range(10)])
        await w.writer.close_ledger(lid, PW)
        md = await w.metadata(lid)
        assert len(md.segments) == 2 and first[0] not in md.segments[1].ensemble
        await w.lose(first[0])
        await w.marks.mark(lid, [first[0]])
        assert outcome(await w.worker.run_once()) == REPLICATED
        after = await w.metadata(lid)
        assert after.segments[1] == md.segments[1]
        replacement = after.segments[0].ensemble[0]
        end = md.segments[1].first_entry_id
        assert set(range(end)) <= set(w.fake[replacement].entries[lid])
        assert w.worker.statistics()["entries_copied"] == end  # Qw = E: every entry of the first segment only
        await w.assert_fully_replicated(lid, 20, first[0])
    run(main())


def test_an_open_ledger_is_left_to_its_writer_within_the_grace_then_recovered_and_copied():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 20, close=False)
        lid = h.ledger_id
        victim = h.metadata.ensemble[2]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        line = await w.worker.run_once()
        assert outcome(line) == DEFERRED, line
        assert (await w.metadata(lid)).state is LedgerState.OPEN
        assert await w.marks.get(lid) is not None and await w.marks.lock_owner(lid) is None
        w.clock.advance(CONFIG.worker_backoff_ms - 1)
        assert await w.worker.run_once() is None  # deferred: not claimed again before a back-off
        w.clock.advance(1)
        assert outcome(await w.worker.run_once()) == DEFERRED  # looked at again: still OPEN within the grace
        w.clock.advance(CONFIG.open_ledger_rereplication_grace_ms)
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        md = await w.metadata(lid)
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 19
        await w.assert_fully_replicated(lid, 20, victim)
        assert w.worker.statistics()["recovered"] == 1
        assert await w.marks.get(lid) is None and await w.marks.lock_owner(lid) is None
    run(main())


def test_an_open_ledger_its_writer_closes_within_the_grace_is_copied_after_a_back_off_not_the_whole_grace():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 20, close=False)
        lid = h.ledger_id
        victim = h.metadata.ensemble[2]
        await w.marks.mark(lid, [victim])
        assert outcome(await w.worker.run_once()) == DEFERRED
        await w.writer.close_ledger(lid, PW)  # its writer closes it (the victim still answered)
        await w.lose(victim)
        w.clock.advance(CONFIG.worker_backoff_ms)
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        assert w.worker.statistics()["recovered"] == 0  # closed by its writer, not recovered
        await w.assert_fully_replicated(lid, 20, victim)
    run(main())


def test_an_open_ledger_s_earlier_segment_is_copied_while_its_writer_goes_on():
    async def main():
        w = await World().start()
        h = await w.writer.create_ledger(3, 2, 2, password=PW)
        lid = h.ledger_id
        await asyncio.gather(*[h.append(b"a%d" % i) for i in range(10)])
        victim = h.metadata.ensemble[0]
        w.fake[victim].down = True
        await asyncio.gather(*[h.append(b"b%d" % i) for i in range(10)])  # ensemble change: segment 2 without it
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        assert outcome(await w.worker.run_once()) == REPLICATED
        md = await w.metadata(lid)
        assert md.state is LedgerState.OPEN and all(victim not in s.ensemble for s in md.segments)
        await asyncio.gather(*[h.append(b"c%d" % i) for i in range(10)])  # the writer is not disturbed
        await w.writer.close_ledger(lid, PW)
        await w.assert_fully_replicated(lid, 30, victim)
    run(main())


def test_a_cas_conflict_is_re_decided_on_the_new_metadata_and_never_overwrites_it():
    async def main():
        w = await World().start()
        # 1. an unrelated write lands between the copy and the CAS: applied on top of it
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        victim = h.metadata.ensemble[0]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        md0 = await w.metadata(lid)

        async def touch(_bookie):
            data, version = await w.store.get(ledger_path(lid))
            await w.store.set(ledger_path(lid), data, version)

        w.fake.hook_bookies = set(BOOKIES) - set(md0.ensemble)
        w.fake.after_add = touch
        assert outcome(await w.worker.run_once()) == REPLICATED
        assert w.fake.after_add is None  # the conflict happened
        await w.assert_fully_replicated(lid, 12, victim)
        # 2. another worker replaces the same bookie meanwhile: this one re-decides and keeps that replacement
        h2 = await w.ledger(3, 2, 2, 12)
        lid2 = h2.ledger_id
        md = await w.metadata(lid2)
        victim2 = md.ensemble[0]
        spares = [b for b in BOOKIES if b not in md.ensemble and b != victim]
        await w.lose(victim2)
        await w.marks.mark(lid2, [victim2])
        chosen = []

        async def other_worker(bookie):  # another worker copied to another spare and replaced the bookie first
            [other] = [b for b in spares if b != bookie]
            chosen.append(other)
            for e in range(12):
                if victim2 in md.write_set(e):
                    w.fake[other].entries.setdefault(lid2, {})[e] = w.fake[victim2].entries[lid2][e]
            await update_ledger_metadata(w.store, lid2, lambda m: m.with_replaced_bookie(0, victim2, other),
                                         attempts_max=3)

        w.fake.hook_bookies = set(spares)
        w.fake.after_add = other_worker
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        after = await w.metadata(lid2)
        assert chosen and after.ensemble[0] == chosen[0]  # never overwritten
        assert any("re-deciding" in line for line in w.lines)
        await w.assert_fully_replicated(lid2, 12, victim2)
    run(main())


def test_the_writer_s_own_ensemble_change_during_the_copy_is_kept():
    async def main():
        w = await World().start()
        h = await w.writer.create_ledger(3, 2, 2, password=PW)
        lid = h.ledger_id
        await asyncio.gather(*[h.append(b"a%d" % i) for i in range(10)])
        victim = h.metadata.ensemble[1]
        w.fake[victim].down = True
        await asyncio.gather(*[h.append(b"b%d" % i) for i in range(10)])
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        second = h.metadata.ensemble
        w.fake.hook_bookies = set(BOOKIES) - set(h.metadata.segments[0].ensemble) - {victim}

        async def writer_changes_ensemble(_bookie):  # the writer loses another bookie of its last segment
            w.fake[second[0]].down = True
            await asyncio.gather(*[h.append(b"c%d" % i) for i in range(5)])

        w.fake.after_add = writer_changes_ensemble
        assert outcome(await w.worker.run_once()) == REPLICATED
        md = await w.metadata(lid)
        assert len(md.segments) == 3 and all(victim not in s.ensemble for s in md.segments)
        assert md.segments[2].ensemble == h.metadata.ensemble
        w.fake[second[0]].down = False
        await w.writer.close_ledger(lid, PW)
        got = [e.payload async for e in w.writer.read_entries(lid, 0, 24, password=PW)]
        assert got == [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)] + [b"c%d" % i
                                                                                             for i in range(5)]
    run(main())


def test_an_entry_no_surviving_replica_holds_marks_the_ledger_lost_and_it_is_not_retried_at_once():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        md = await w.metadata(lid)
        victim = md.ensemble[0]
        gone = [e for e in range(12) if victim in md.write_set(e)][:2]
        for e in gone:  # the other replica lost these two too
            [other] = [b for b in md.write_set(e) if b != victim]
            del w.fake[other].entries[lid][e]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        line = await w.worker.run_once()
        assert outcome(line) == LOST, line
        mark = await w.marks.get(lid)
        assert mark is not None and mark.lost_entries == 2 and str(gone[0]) in mark.note
        assert await w.metadata(lid) == md  # the lost bookie stays named: no replica dropped
        assert await w.marks.lock_owner(lid) is None
        assert await w.worker.run_once() is None
        w.clock.advance(CONFIG.lost_ledger_retry_ms)
        assert outcome(await w.worker.run_once()) == LOST
    run(main())


@pytest.mark.parametrize("silent_marked", [False, True], ids=["not-marked", "marked-but-registered"])
def test_an_entry_whose_replica_does_not_answer_is_a_failure_with_backoff_not_a_loss(silent_marked):
    """A replica that is registered but does not answer (down for now, a message lost, a read sent before it was
    back) may still hold its copies, whether the mark names it or not (marked while it was away, registered
    again since): its silence is a failure, tried again after the back-off, never a lost copy."""
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        md = await w.metadata(lid)
        victim, silent = md.ensemble[0], md.ensemble[1]
        await w.lose(victim)
        w.fake[silent].down = True
        await w.marks.mark(lid, [victim, silent] if silent_marked else [victim])
        line = await w.worker.run_once()
        assert outcome(line) == FAILED and "READ_FAILED" in line, line
        mark = await w.marks.get(lid)
        assert mark.lost_entries == 0 and await w.marks.lock_owner(lid) is None
        assert await w.metadata(lid) == md
        w.fake[silent].down = False
        assert outcome(await w.worker.run_once()) == REPLICATED
        await w.assert_fully_replicated(lid, 12, victim)
        assert silent in (await w.metadata(lid)).ensemble  # it holds its copies: kept
    run(main())


def test_no_replacement_bookie_fails_and_releases_the_lock():
    async def main():
        w = await World().start(bookies=BOOKIES[:3])
        h = await w.ledger(3, 2, 2, 6)
        lid = h.ledger_id
        await w.lose(h.metadata.ensemble[0])
        await w.marks.mark(lid, [h.metadata.ensemble[0]])
        line = await w.worker.run_once()
        assert outcome(line) == FAILED and "NOT_ENOUGH_BOOKIES" in line, line
        assert await w.marks.lock_owner(lid) is None and await w.marks.get(lid) is not None
    run(main())


def test_a_mark_another_worker_holds_is_not_claimed_and_a_deleted_ledger_loses_its_mark():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 6)
        lid = h.ledger_id
        await w.lose(h.metadata.ensemble[0])
        await w.marks.mark(lid, [h.metadata.ensemble[0]])
        other = UnderReplicationMarks(w.store.session("worker-2"), w.clock)
        assert await other.claim(lid, "worker-2")
        assert await w.worker.run_once() is None
        assert await w.marks.lock_owner(lid) == "worker-2"
        await other.release(lid)
        await w.writer.delete_ledger(lid, password=PW)
        line = await w.worker.run_once()
        assert outcome(line) == DELETED, line
        assert await w.marks.get(lid) is None and await w.marks.lock_owner(lid) is None
    run(main())


def test_a_mark_that_changes_during_the_copy_stays_for_the_next_round():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        first, second = h.metadata.ensemble[0], h.metadata.ensemble[1]
        await w.lose(first)
        await w.marks.mark(lid, [first])
        w.fake.hook_bookies = set(BOOKIES) - set(h.metadata.ensemble)

        async def second_loss(_bookie):
            await w.marks.mark(lid, [second])

        w.fake.after_add = second_loss
        assert outcome(await w.worker.run_once()) == REMARKED
        mark = await w.marks.get(lid)
        assert mark.missing == tuple(sorted([first, second]))
        # second is live and answers that it holds every copy it must: kept, as BookKeeper checks a fragment first
        assert outcome(await w.worker.run_once()) == REPLICATED
        md = await w.metadata(lid)
        assert first not in md.ensemble and second in md.ensemble
        await w.assert_fully_replicated(lid, 12, first)
    run(main())


def test_disabled_replication_claims_nothing():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 6)
        lid = h.ledger_id
        await w.lose(h.metadata.ensemble[0])
        await w.marks.mark(lid, [h.metadata.ensemble[0]])
        await w.marks.disable()
        md = await w.metadata(lid)
        assert await w.worker.run_once() is None
        assert await w.metadata(lid) == md and await w.marks.get(lid) is not None
        assert w.worker.statistics()["claims"] == 0
        await w.marks.enable()
        assert outcome(await w.worker.run_once()) == REPLICATED
    run(main())


def test_the_copy_rate_is_limited_by_sleeping_on_the_clock():
    async def main():
        entry_bytes = 36 + 64  # header + payload
        config = AutoRecoveryConfig(rereplication_bytes_per_s_max=10 * entry_bytes, read_batch_entries=5)
        w = await World().start(config=config)
        h = await w.writer.create_ledger(3, 3, 2, password=PW)
        lid = h.ledger_id
        await asyncio.gather(*[h.append(bytes(64)) for _ in range(30)])
        await w.writer.close_ledger(lid, PW)
        victim = h.metadata.ensemble[0]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        start = w.clock.now
        assert outcome(await w.worker.run_once()) == REPLICATED
        # 30 entries of 100 bytes at 1000 bytes/s after a burst of 1000 bytes: 2 s of sleeps, nothing else
        assert w.clock.now - start == 2_000
        assert w.worker.statistics()["throttled_ms"] == 2_000
        assert w.worker.statistics()["bytes_copied"] == 30 * entry_bytes
    run(main())


def test_the_token_bucket_sleeps_only_for_its_debt():
    async def main():
        clock = ManualClock(sleeps_advance=True)
        bucket = TokenBucket(clock, rate_per_s=1_000, burst=500)
        await bucket.take(500)
        assert clock.now == 0
        await bucket.take(250)
        assert clock.now == 250
        clock.advance(10_000)  # idle time refills up to the burst only
        await bucket.take(500)
        assert clock.now == 10_250
        await bucket.take(100)
        assert clock.now == 10_350
    run(main())


def test_run_repairs_every_mark_and_stops_when_asked():
    async def main():
        w = await World().start()
        ledgers = [await w.ledger(3, 2, 2, 8) for _ in range(3)]
        victim = ledgers[0].metadata.ensemble[0]
        await w.lose(victim)
        marked = [h.ledger_id for h in ledgers if victim in h.metadata.ensemble]
        for lid in marked:
            await w.marks.mark(lid, [victim])
        stop = asyncio.Event()
        task = asyncio.create_task(w.worker.run(stop))
        await wait_until_async(lambda: _no_marks(w), 5.0, message="every mark repaired")
        stop.set()
        await asyncio.wait_for(task, 5.0)
        for lid in marked:
            await w.assert_fully_replicated(lid, 8, victim)
        assert w.worker.statistics()["replicated"] == len(marked)
    run(main())


def test_run_backs_off_after_a_failed_claim_on_the_clock():
    async def main():
        w = await World().start(clock=ManualClock())  # sleeps wait for advance()
        h = await w.ledger(3, 2, 2, 6)
        lid = h.ledger_id
        victim, silent = h.metadata.ensemble[0], h.metadata.ensemble[1]
        await w.lose(victim)
        w.fake[silent].down = True
        await w.marks.mark(lid, [victim])
        stop = asyncio.Event()
        task = asyncio.create_task(w.worker.run(stop))
        await wait_until_async(lambda: w.clock.sleepers == 1, 5.0, message="the worker backing off")
        assert w.worker.statistics()["failed"] == 1 and await w.marks.lock_owner(lid) is None
        w.fake[silent].down = False
        w.clock.advance(CONFIG.worker_backoff_ms - 1)
        assert w.clock.sleepers == 1 and w.worker.statistics()["claims"] == 1  # still backing off
        w.clock.advance(1)
        await wait_until_async(lambda: _no_marks(w), 5.0, message="the mark repaired after the backoff")
        await wait_until_async(lambda: w.clock.sleepers == 1, 5.0, message="the worker idle again")
        assert w.worker.statistics()["claims"] == 2
        stop.set()
        await asyncio.wait_for(task, 5.0)
        await w.assert_fully_replicated(lid, 6, victim)
    run(main())


async def _no_marks(w):
    return await w.marks.list() == []


def test_a_write_set_of_one_bookie_whose_bookie_is_gone_is_reported_lost():
    async def main():
        w = await World().start()
        h = await w.ledger(2, 1, 1, 6)
        lid = h.ledger_id
        victim = h.metadata.ensemble[0]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        line = await w.worker.run_once()  # Qw = 1: no other replica to ask, and the only one is gone
        assert outcome(line) == LOST, line
        assert (await w.marks.get(lid)).lost_entries == 3
    run(main())


def test_a_ledger_found_lost_because_a_marked_bookie_was_away_is_tried_again_once_it_registers():
    # sim seeds 710894, 711720, 711974: a bookie down for now (not lost for good) was the only replica of some
    # entries; the lost verdict was right while it was away, but the worker kept it for lost_ledger_retry_ms after
    # the bookie registered again, so the ledger was reported lost while every entry had a copy
    async def main():
        w = await World().start()
        h = await w.ledger(2, 1, 1, 6)
        lid = h.ledger_id
        md = await w.metadata(lid)
        away = md.ensemble[0]
        await w.lose(away)  # down and unregistered; Qw = 1: no other replica of its entries
        await w.marks.mark(lid, [away])
        line = await w.worker.run_once()
        assert outcome(line) == LOST, line
        assert away in (await w.marks.get(lid)).note
        assert await w.worker.run_once() is None  # not tried again while it stays away
        w.fake[away].down = False  # it runs again with every copy it had, not registered yet
        assert await w.worker.run_once() is None
        await w.registrations.create(bookie_path(away), b"{}", ephemeral=True)
        line = await w.worker.run_once()  # well within lost_ledger_retry_ms
        assert outcome(line) == REPLICATED, line
        assert await w.marks.get(lid) is None and await w.metadata(lid) == md
    run(main())


def test_a_lost_verdict_that_rested_on_a_bookie_registered_again_is_withdrawn_by_any_worker():
    # sim seed 764273: the only two replicas of a segment were away (one lost for good, one down for now) and the
    # ledger was found lost; the bookie down for now registered again while the worker that found it was busy,
    # and the other worker's claim, which could not read it yet, failed and left the verdict in the mark: the
    # ledger stayed reported lost with every entry on a registered bookie
    async def main():
        w = await World().start()
        h = await w.ledger(2, 2, 2, 6)
        lid = h.ledger_id
        md = await w.metadata(lid)
        gone, away = md.ensemble
        await w.lose(gone)
        await w.lose(away)  # down for now: it comes back with every copy it had
        await w.marks.mark(lid, [gone, away])
        line = await w.worker.run_once()
        assert outcome(line) == LOST, line
        mark = await w.marks.get(lid)
        assert mark.lost_entries == 6 and gone in mark.note and away in mark.note
        other = w.another_worker("worker-2")  # it never saw the verdict being made
        await w.registrations.create(bookie_path(away), b"{}", ephemeral=True)  # back, not answering yet
        line = await other.run_once()
        assert outcome(line) == FAILED and "READ_FAILED" in line, line
        mark = await w.marks.get(lid)
        assert (mark.lost_entries, mark.note) == (0, ""), mark  # no longer reported lost
        assert mark.missing == tuple(sorted((gone, away)))
        w.fake[away].down = False
        line = await w.worker.run_once()  # well within lost_ledger_retry_ms
        assert outcome(line) == REPLICATED, line
        await w.assert_fully_replicated(lid, 6, gone)
        assert away in (await w.metadata(lid)).ensemble and await w.marks.get(lid) is None
    run(main())


def test_a_ledger_found_lost_from_explicit_negatives_waits_the_retry_even_when_a_marked_bookie_registers():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        md = await w.metadata(lid)
        victim, other = md.ensemble[0], md.ensemble[1]
        gone = [e for e in range(12) if md.write_set(e) == [victim, other]]
        for e in gone:  # the only two copies: the victim's is damaged away (NO_ENTRY), the other's too
            del w.fake[victim].entries[lid][e]
            del w.fake[other].entries[lid][e]
        await w.registrations.delete(bookie_path(victim))  # away for a moment, marked, back: it answers NO_ENTRY
        await w.marks.mark(lid, [victim])
        await w.registrations.create(bookie_path(victim), b"{}", ephemeral=True)
        line = await w.worker.run_once()
        assert outcome(line) == LOST, line
        assert await w.worker.run_once() is None  # the verdict rests on answers, not on a bookie's silence
        w.clock.advance(CONFIG.lost_ledger_retry_ms)
        assert outcome(await w.worker.run_once()) == LOST
    run(main())


def test_a_marked_bookie_back_with_its_copies_is_kept_and_its_mark_removed():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        md = await w.metadata(lid)
        back = md.ensemble[0]
        await w.marks.mark(lid, [back])  # marked while it was away; it runs again with every copy it had
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        assert await w.metadata(lid) == md and w.worker.statistics()["entries_copied"] == 0
        assert await w.marks.get(lid) is None
    run(main())


def test_a_marked_bookie_back_may_be_the_replacement_of_another_one():
    async def main():
        w = await World().start(bookies=BOOKIES[:4])
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        md = await w.metadata(lid)
        [spare] = set(BOOKIES[:4]) - set(md.ensemble)
        victim = md.ensemble[0]
        await w.lose(victim)
        await w.marks.mark(lid, [victim, spare])  # the spare was marked too while it was briefly away
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        await w.assert_fully_replicated(lid, 12, victim)
        assert spare in (await w.metadata(lid)).ensemble
    run(main())


def test_a_registered_bookie_that_must_hold_no_entry_of_a_segment_is_kept_not_swapped_with_another_marked_one():
    # sim seed 753674: the check of all ledgers marked two registered bookies, each lacking an entry of another
    # segment; in a one-entry segment of E=4 Qw=3 the bookie at index 3 must hold nothing, answered NO_LEDGER and
    # was replaced by the other marked bookie (the only spare), which answered NO_LEDGER there in turn: the two
    # were swapped back and forth until the claim gave up, every claim, and the mark stayed for ever
    async def main():
        w = await World().start(bookies=BOOKIES[:5])
        h = await w.ledger(4, 3, 2, 1)  # entry 0's write set: indexes 0, 1, 2
        lid = h.ledger_id
        md = await w.metadata(lid)
        [spare] = set(BOOKIES[:5]) - set(md.ensemble)
        emptied, idle = md.ensemble[2], md.ensemble[3]
        assert lid not in w.fake[idle].entries
        del w.fake[emptied].entries[lid]  # it lacks entry 0 (a truncated journal): NO_LEDGER, as the idle one
        w.fake[emptied].keys.pop(lid, None)
        await w.marks.mark(lid, [emptied, idle])  # both registered, as the check of all ledgers marks them
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        after = await w.metadata(lid)
        assert list(after.ensemble) == [*md.ensemble[:2], spare, idle]  # the idle one kept where it holds nothing
        assert w.worker.statistics()["segments_replaced"] == 1 and await w.marks.get(lid) is None
        await w.assert_fully_replicated(lid, 1, emptied)
    run(main())


def test_a_lost_bookie_that_must_hold_no_entry_of_a_segment_is_still_replaced_in_it():
    async def main():
        w = await World().start()
        h = await w.ledger(4, 3, 2, 1)  # entry 0's write set: indexes 0, 1, 2
        lid = h.ledger_id
        md = await w.metadata(lid)
        idle = md.ensemble[3]
        await w.lose(idle)
        await w.marks.mark(lid, [idle])
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        after = await w.metadata(lid)
        assert idle not in after.ensemble and after.ensemble[:3] == md.ensemble[:3]
        assert w.worker.statistics()["entries_copied"] == 0  # nothing to copy: the metadata no longer names it
    run(main())


# -- damaged copies ------------------------------------------------------------------------------------------------

def flip_byte(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # a payload byte: the digest no longer matches
    return bytes(damaged)


def test_a_marked_bookie_that_lists_everything_but_holds_a_damaged_copy_is_replaced_not_kept():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        md = await w.metadata(lid)
        damaged = md.write_set(7)[0]
        original = {entry_id: data for entry_id, (data,) in w.copies(lid).items()}
        w.fake[damaged].entries[lid][7] = flip_byte(w.fake[damaged].entries[lid][7])
        await w.marks.mark(lid, [damaged])  # as the check of all ledgers marks it: a live bookie, every id listed
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        after = await w.metadata(lid)
        assert damaged not in after.ensemble and await w.marks.get(lid) is None
        [replacement] = set(after.ensemble) - set(md.ensemble)
        for entry_id in range(12):  # every copy the metadata names is the entry as written
            assert {w.fake[b].entries[lid][entry_id] for b in after.write_set(entry_id)} == {original[entry_id]}
        assert w.fake[replacement].entries[lid][7] == original[7] != w.fake[damaged].entries[lid][7]
        assert w.worker.statistics()["damaged_bookies_replaced"] == 1
        assert any(f"{damaged} lists every entry it must but 1 of its copies are damaged (entries [7])" in line
                   for line in w.lines), w.lines
    run(main())


def test_a_marked_bookie_whose_copy_differs_from_the_majority_is_replaced():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 3, 2, 6)
        lid = h.ledger_id
        md = await w.metadata(lid)
        odd = md.ensemble[2]
        w.fake[odd].entries[lid][4] = w.fake[odd].entries[lid][3]  # a valid entry, the wrong one
        await w.marks.mark(lid, [odd])
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        assert odd not in (await w.metadata(lid)).ensemble
    run(main())


def test_the_copy_is_taken_from_a_replica_whose_digest_verifies_never_from_a_damaged_one():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 3, 2, 9)
        lid = h.ledger_id
        md = await w.metadata(lid)
        victim, damaged, intact = md.ensemble
        for entry_id in range(9):  # every copy on one surviving replica is damaged; the other is intact
            w.fake[damaged].entries[lid][entry_id] = flip_byte(w.fake[damaged].entries[lid][entry_id])
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        [replacement] = set((await w.metadata(lid)).ensemble) - set(md.ensemble)
        assert w.fake[replacement].entries[lid] == w.fake[intact].entries[lid]
    run(main())


def test_a_marked_bookie_with_intact_copies_is_still_kept_after_they_are_verified():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 20)
        lid = h.ledger_id
        md = await w.metadata(lid)
        back = md.ensemble[1]
        await w.marks.mark(lid, [back])
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        assert await w.metadata(lid) == md and w.worker.statistics()["entries_copied"] == 0
        # its copies and those of the rest of each write set were read and found good
        assert w.worker.statistics()["copies_verified"] == 2 * sum(1 for e in range(20) if back in md.write_set(e))
    run(main())


def test_a_marked_bookie_kept_in_a_claim_and_lost_before_the_claim_ends_is_replaced_not_left_in_the_metadata():
    # sim seed 786941: a marked bookie back with its copies was kept in one segment, then lost for good while the
    # claim went on (its other segment took long); the auditor's mark, naming it already, left the mark as it
    # was, so the claim removed it with a segment still naming the lost bookie: under-replicated, unmarked
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        md = await w.metadata(lid)
        back = md.ensemble[0]
        await w.marks.mark(lid, [back])  # marked while it was away; it runs again with every copy it had
        reads = w.fake.read_entries

        async def read_entries(bookie, ledger_id, entry_ids, **kw):
            out = await reads(bookie, ledger_id, entry_ids, **kw)
            if bookie == back and not w.fake[back].down:  # its copies answered the verification; then it dies
                await w.lose(back)
                assert await w.marks.mark(lid, [back]) == await w.marks.get(lid)  # the auditor: nothing new
            return out
        w.fake.read_entries = read_entries
        line = await w.worker.run_once()
        assert w.fake[back].down, "the bookie was lost during the claim"
        assert outcome(line) == REPLICATED, line
        await w.assert_fully_replicated(lid, 12, back)
        assert w.worker.statistics()["segments_replaced"] == 1 and await w.marks.get(lid) is None
    run(main())


def test_a_marked_bookie_that_lists_everything_but_answers_no_read_is_replaced():
    async def main():
        w = await World().start()
        h = await w.ledger(3, 2, 2, 12)
        lid = h.ledger_id
        md = await w.metadata(lid)
        mute = md.ensemble[2]
        reads = w.fake.read_entries

        async def read_entries(bookie, ledger_id, entry_ids, **kw):
            if bookie == mute:
                raise BookieUnreachable(bookie, "deadline passed (test)")
            return await reads(bookie, ledger_id, entry_ids, **kw)
        w.fake.read_entries = read_entries
        await w.marks.mark(lid, [mute])
        line = await w.worker.run_once()
        assert outcome(line) == REPLICATED, line
        assert mute not in (await w.metadata(lid)).ensemble
        assert w.worker.statistics()["unverified_bookies_replaced"] == 1
    run(main())


class _Flight:
    """Entries of one ledger a worker has in flight: first asked for in a read, not yet acknowledged by the
    replacement's add; adds wait at a gate the test opens."""

    def __init__(self, w, lid) -> None:
        self.started: set[int] = set()
        self.finished: set[int] = set()
        self.peak = 0
        self.gate = asyncio.Event()
        reads, adds = w.fake.read_entries, w.fake.add

        async def read_entries(bookie, ledger_id, entry_ids, **kw):
            if ledger_id == lid:
                self.started.update(entry_ids)
                self.peak = max(self.peak, self.now)
            return await reads(bookie, ledger_id, entry_ids, **kw)

        async def add(bookie, entries):
            await self.gate.wait()
            out = await adds(bookie, entries)
            self.finished.update(decode_entry(e).entry_id for e, _, _ in entries)
            return out
        w.fake.read_entries, w.fake.add = read_entries, add

    @property
    def now(self) -> int:
        return len(self.started) - len(self.finished)


def test_at_most_rereplication_entry_batch_size_entries_are_in_flight_and_later_batches_are_read_meanwhile():
    async def main():
        config = dataclasses.replace(CONFIG, read_batch_entries=4, rereplication_entry_batch_size=12)
        w = await World().start(config=config)
        h = await w.ledger(3, 3, 2, 40)
        lid = h.ledger_id
        victim = h.metadata.ensemble[0]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        flight = _Flight(w, lid)
        claim = asyncio.ensure_future(w.worker.run_once())
        # no add is answered: the worker reads three batches of 4 ahead, then waits for room
        await wait_until_async(lambda: flight.now == 12, 5, message="three batches read ahead")
        for _ in range(20):  # what is tested is that nothing more happens: give the worker turns to try
            await asyncio.sleep(0)
        assert flight.now == 12 and not claim.done()
        flight.gate.set()
        assert outcome(await claim) == REPLICATED
        assert flight.peak == 12 and flight.finished == set(range(40))  # never more than 12 entries in flight
        assert w.worker.statistics()["batches_inflight_max"] == 3
        await w.assert_fully_replicated(lid, 40, victim)
    run(main())


def test_an_entry_batch_size_below_the_read_batch_makes_the_batches_that_small_and_one_at_a_time():
    async def main():
        config = dataclasses.replace(CONFIG, read_batch_entries=8, rereplication_entry_batch_size=3)
        w = await World().start(config=config)
        h = await w.ledger(3, 3, 2, 20)
        lid = h.ledger_id
        victim = h.metadata.ensemble[1]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        flight = _Flight(w, lid)
        flight.gate.set()
        assert outcome(await w.worker.run_once()) == REPLICATED
        assert flight.peak == 3 and w.worker.statistics()["batches_inflight_max"] == 1
        md = await w.metadata(lid)
        reads = [ids for b in md.ensemble for (ledger, ids, _) in w.fake[b].read_calls if ledger == lid]
        assert max(len(ids) for ids in reads) <= 3
        await w.assert_fully_replicated(lid, 20, victim)
    run(main())


def test_a_failed_batch_stops_the_batches_in_flight_and_the_claim_fails_without_a_replacement():
    async def main():
        config = dataclasses.replace(CONFIG, read_batch_entries=4, rereplication_entry_batch_size=16)
        w = await World().start(config=config)
        h = await w.ledger(3, 3, 2, 40)
        lid = h.ledger_id
        victim = h.metadata.ensemble[0]
        await w.lose(victim)
        await w.marks.mark(lid, [victim])
        adds = w.fake.add
        calls = 0

        async def add(bookie, entries):
            nonlocal calls
            calls += 1
            if calls == 2:
                raise BookieUnreachable(bookie, "connection reset (test)")
            return await adds(bookie, entries)
        w.fake.add = add
        line = await w.worker.run_once()
        assert outcome(line) == FAILED and "connection reset" in line, line
        assert victim in (await w.metadata(lid)).ensemble  # nothing replaced: not every entry was copied
        assert await w.marks.lock_owner(lid) is None and (await w.marks.get(lid)).missing == (victim,)
        # no batch left running (the cancelled ones end within a few loop turns)
        await wait_until_async(lambda: not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()], 5,
                               interval_s=0, message="every batch task to end")
    run(main())
