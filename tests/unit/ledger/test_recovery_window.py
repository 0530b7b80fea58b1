"""Recovery's windowed read-forward (LedgerRecovery(read_window=W)): the same decisions as one entry at a time
(read_window=1) over seeded random histories with replies interleaved across entries at random, the end at
the first absent entry whatever was found above it, failure on an unknown entry, duplicates and late replies
ignored, at most W undecided entries (W * Qw reads) waited on, and the round trips the window saves."""
from __future__ import annotations

import copy
import math
import random

import pytest

from bksim.formats.entry import decode_entry
from bksim.ledger.recovery import LedgerRecovery, ReadEntry, RecoveryFailed, RecoveryPhase
from bksim.ledger.writer import CloseLedger, SendAdd, UpdateEnsemble
from bksim.model.errors import BksimError
from bksim.model.status import StatusCode as S

from .test_recovery import FakeBookies, write

STEPS_MAX = 200_000


class Run:
    """One recovery driven to its end against `bookies`: what it decided and what it sent."""

    def __init__(self, rec: LedgerRecovery):
        self.rec = rec
        self.closed: CloseLedger | None = None
        self.write_back: list = []  # SendAdd / UpdateEnsemble / CloseLedger in the order recovery sent them
        self.ok_reads: list[ReadEntry] = []  # delivered ReadEntry (entry >= 0) answered with a copy
        self.max_waited_reads = 0  # most reads of undecided entries pending at once (READING)
        self.max_waited_entries = 0


def drive(rec: LedgerRecovery, bookies: FakeBookies, segments: list, *, rank, rng: random.Random | None = None,
          duplicates: float = 0.0) -> Run:
    """Reads: each step picks an entry with pending reads (at random with `rng`, else the lowest) and delivers
    its pending read of lowest rank(entry, bookie): every entry sees its replies in the same order whatever
    the interleaving across entries. With probability `duplicates` a reply already delivered is delivered
    again instead (it must change nothing). Write-back commands are answered first, in order; reads still
    pending at the end are delivered late (they must change nothing either)."""
    run = Run(rec)
    reads: list[ReadEntry] = []
    writes: list = []
    delivered: list[ReadEntry] = []
    writable = [b for b in sorted(bookies.data) if b not in bookies.down]

    def take(commands):
        for c in commands:
            if isinstance(c, ReadEntry):
                reads.append(c)
            else:
                writes.append(c)

    def check_window():
        if rec.phase is not RecoveryPhase.READING:
            return
        waited = [r for r in reads if r.entry_id >= rec.next_to_decide]
        assert all(r.entry_id < rec.next_to_decide + rec.read_window for r in waited), (rec.next_to_decide, waited)
        assert len(waited) <= rec.read_window * rec.write_quorum_size
        run.max_waited_reads = max(run.max_waited_reads, len(waited))
        run.max_waited_entries = max(run.max_waited_entries, len({r.entry_id for r in waited}))

    take(rec.start_recovery())
    for _ in range(STEPS_MAX):
        check_window()
        if writes:
            c = writes.pop(0)
            if isinstance(c, RecoveryFailed):
                continue
            run.write_back.append(c)
            if isinstance(c, SendAdd):
                assert c.recovery
                take(rec.forward(rec.writer.on_add_result(c.entry_id, c.bookie, bookies.add(c), writable)))
            elif isinstance(c, UpdateEnsemble):
                if segments[-1][0] == c.first_entry_id:
                    segments[-1] = (c.first_entry_id, c.ensemble)
                else:
                    segments.append((c.first_entry_id, c.ensemble))
                take(rec.forward(rec.writer.on_ensemble_changed(c.first_entry_id, c.ensemble)))
            elif isinstance(c, CloseLedger):
                run.closed = c
                take(rec.on_closed())
            continue
        if not reads:
            return run
        if delivered and rng is not None and rng.random() < duplicates:
            again = rng.choice(delivered)
            status, data = bookies.read(again)
            assert rec.on_read_result(again.bookie, again.entry_id, status, data) == [], again
            continue
        entries = sorted({r.entry_id for r in reads})
        if rec.phase in (RecoveryPhase.DONE, RecoveryPhase.FAILED):
            entry_id = entries[0]
        else:
            entry_id = rng.choice(entries) if rng is not None else entries[0]
        read = min((r for r in reads if r.entry_id == entry_id), key=lambda r: rank(r.entry_id, r.bookie))
        reads.remove(read)
        delivered.append(read)
        status, data = bookies.read(read)
        if status is S.OK and read.entry_id >= 0:
            run.ok_reads.append(read)
        take(rec.on_read_result(read.bookie, read.entry_id, status, data))
    raise AssertionError(f"recovery did not end in {STEPS_MAX} steps")


def history(seed: int):
    """A random history like test_recovery's: a writer that dies mid-stream (each add reaches its bookie with
    probability `cut`), bookies that do not answer, and spares for write-back ensemble changes."""
    rng = random.Random(seed)
    e = rng.randint(1, 5)
    qw = rng.randint(1, e)
    qa = rng.randint(1, qw)
    names = [f"b{i}" for i in range(e)]
    bookies = FakeBookies(names + [f"spare{i}" for i in range(rng.randint(0, 2))])
    n = rng.randint(0, 40)
    cut = rng.choice([rng.random(), 0.9, 0.97])
    write(bookies, names, qw, qa, n, lambda s: rng.random() < cut)
    bookies.down = {x for x in names if rng.random() < 0.1}
    return bookies, names, qw, qa


def recovery(names, qw, qa, window: int, segments: list) -> LedgerRecovery:
    return LedgerRecovery(5, segments=segments, write_quorum_size=qw, ack_quorum_size=qa, rng=random.Random(7),
                          read_window=window)


def test_windowed_recovery_decides_what_one_entry_at_a_time_decides():
    cases = {"closed": 0, "failed": 0, "copies above the end": 0, "window used": 0}
    for seed in range(300):
        bookies, names, qw, qa = history(seed)

        def rank(entry_id, bookie, seed=seed):  # the order in which an entry's replies arrive, fixed per seed
            return random.Random(f"{seed}/{entry_id}/{bookie}").random()

        ref_segments = [(0, tuple(names))]
        ref = drive(recovery(names, qw, qa, 1, ref_segments), copy.deepcopy(bookies), ref_segments, rank=rank)
        for window in (2, 3, 8, 64):
            segments = [(0, tuple(names))]
            rng = random.Random(seed * 1000 + window)
            run = drive(recovery(names, qw, qa, window, segments), copy.deepcopy(bookies), segments, rank=rank,
                        rng=rng, duplicates=0.1)
            where = (seed, window)
            assert run.rec.phase is ref.rec.phase, (where, run.rec.failure, ref.rec.failure)
            assert run.rec.failure == ref.rec.failure, where
            assert run.rec.start == ref.rec.start, where
            assert run.rec.found == ref.rec.found, where  # the write-back's bytes and ledger lengths, in order
            assert run.closed == ref.closed, where
            assert run.write_back == ref.write_back, where
            assert segments == ref_segments, where
            cases["window used"] += run.max_waited_entries > 1
            if run.closed is not None:
                cases["closed"] += 1
                cases["copies above the end"] += any(r.entry_id > run.closed.last_entry_id + 1
                                                     for r in run.ok_reads)
            else:
                cases["failed"] += 1
    # the histories exercise what the window changes: reads ahead, copies found above the end, failures
    assert all(count >= 20 for count in cases.values()), cases


def _three_bookies(n: int, deliver):
    bookies = FakeBookies(["b0", "b1", "b2"])
    _, acked, _ = write(bookies, ["b0", "b1", "b2"], 3, 2, n, deliver)
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=3, ack_quorum_size=2,
                         rng=random.Random(1), read_window=8)
    return bookies, acked, rec


def _fence(rec: LedgerRecovery, bookies: FakeBookies) -> list[ReadEntry]:
    out = []
    for c in rec.start_recovery():
        status, data = bookies.read(c)
        out += rec.on_read_result(c.bookie, -1, status, data)
    assert rec.phase is RecoveryPhase.READING and rec.start == -1
    return out


def _answer(rec: LedgerRecovery, bookies: FakeBookies, read: ReadEntry, status=None) -> list:
    real_status, data = bookies.read(read)
    return rec.on_read_result(read.bookie, read.entry_id, status or real_status, data if status is None else b"")


def test_an_absent_entry_ends_the_read_phase_even_with_copies_found_above_it():
    # entries 0, 1 everywhere; 2 nowhere; 3..5 everywhere (never acknowledged: acks are in order)
    bookies, acked, rec = _three_bookies(6, lambda s: s.entry_id != 2)
    assert acked == [0, 1]
    reads = _fence(rec, bookies)
    assert sorted({r.entry_id for r in reads}) == list(range(8))  # the whole window at once
    by_entry = {}
    for r in reads:
        by_entry.setdefault(r.entry_id, []).append(r)
    for entry_id in (5, 4, 3):  # copies above the hole arrive first: nothing is decided yet
        for r in by_entry[entry_id]:
            assert _answer(rec, bookies, r) == []
    assert rec.found == [] and rec.next_to_decide == 0
    assert _answer(rec, bookies, by_entry[2][0]) == []  # one negative of the Qw - Qa + 1 = 2 needed
    assert _answer(rec, bookies, by_entry[2][1]) == []  # entry 2 absent, but entries 0 and 1 are undecided
    assert _answer(rec, bookies, by_entry[1][2]) == []  # entry 1 exists; entry 0 still undecided
    out = _answer(rec, bookies, by_entry[0][1])  # entry 0 exists: 0, 1 found, 2 absent: the end is 1
    assert rec.phase is RecoveryPhase.WRITING_BACK and not any(isinstance(c, ReadEntry) for c in out)
    assert [decode_entry(e).entry_id for e, _ in rec.found] == [0, 1]
    assert {c.entry_id for c in out if isinstance(c, SendAdd)} == {0, 1}
    # every other reply is late now: entries above the end, the hole's last reply, entries already decided
    for r in reads:
        assert _answer(rec, bookies, r) == []
    closed = [c for c in out if isinstance(c, CloseLedger)]
    assert closed == [] and rec.writer.last_add_pushed == 1


def test_an_unknown_entry_fails_recovery_once_every_entry_below_it_is_found():
    bookies, _, rec = _three_bookies(4, lambda s: s.entry_id != 2)
    reads = {(r.entry_id, r.bookie): r for r in _fence(rec, bookies)}
    # entry 2: one negative and two timeouts: every reply in, neither found nor absent
    assert _answer(rec, bookies, reads[2, "b0"]) == []
    assert _answer(rec, bookies, reads[2, "b1"], S.IO_ERROR) == []
    assert _answer(rec, bookies, reads[2, "b2"], S.IO_ERROR) == []  # not decided: entries 0, 1 are not yet
    assert rec.phase is RecoveryPhase.READING
    assert _answer(rec, bookies, reads[1, "b2"]) == []
    [failed] = _answer(rec, bookies, reads[0, "b0"])
    assert isinstance(failed, RecoveryFailed) and failed.reason.startswith("entry 2: no verified copy")
    assert rec.phase is RecoveryPhase.FAILED and rec.failure == failed.reason
    assert _answer(rec, bookies, reads[3, "b0"]) == []  # late


def test_an_unknown_entry_above_an_absent_one_does_not_fail_recovery():
    bookies, _, rec = _three_bookies(4, lambda s: s.entry_id not in (1, 2))
    reads = {(r.entry_id, r.bookie): r for r in _fence(rec, bookies)}
    for bookie in ("b0", "b1", "b2"):  # entry 2 unknown: all replies in, no decision
        assert _answer(rec, bookies, reads[2, bookie], S.IO_ERROR) == []
    assert _answer(rec, bookies, reads[1, "b2"]) == []
    assert _answer(rec, bookies, reads[1, "b0"]) == []  # entry 1 absent (2 negatives)
    out = _answer(rec, bookies, reads[0, "b1"])
    assert rec.phase is RecoveryPhase.WRITING_BACK and rec.writer.last_add_pushed == 0
    assert {c.entry_id for c in out if isinstance(c, SendAdd)} == {0}


def test_no_read_goes_out_beyond_an_entry_known_to_be_absent():
    bookies, _, rec = _three_bookies(12, lambda s: s.entry_id != 3)
    reads = {(r.entry_id, r.bookie): r for r in _fence(rec, bookies)}
    assert max(e for e, _ in reads) == 7
    assert _answer(rec, bookies, reads[3, "b0"]) == [] and _answer(rec, bookies, reads[3, "b1"]) == []
    assert _answer(rec, bookies, reads[0, "b0"]) == []  # the window would slide to 1..8: no read of 8
    assert _answer(rec, bookies, reads[1, "b0"]) == []
    out = _answer(rec, bookies, reads[2, "b0"])
    assert not any(isinstance(c, ReadEntry) for c in out) and rec.writer.last_add_pushed == 2


def test_duplicates_strangers_and_replies_outside_the_window_change_nothing():
    bookies, _, rec = _three_bookies(20, lambda s: True)
    reads = {(r.entry_id, r.bookie): r for r in _fence(rec, bookies)}
    assert _answer(rec, bookies, reads[1, "b0"]) == []
    status, data = bookies.read(reads[1, "b0"])
    assert rec.on_read_result("b0", 1, status, data) == []  # duplicate
    assert rec.on_read_result("b9", 0, status, data) == []  # not in the write set (even with entry 1's bytes)
    assert rec.on_read_result("b0", 8, S.NO_ENTRY) == []  # not asked yet (outside the window)
    assert rec.on_read_result("b0", 0, S.NO_ENTRY) == [] and rec.on_read_result("b0", 0, S.NO_ENTRY) == []
    assert rec.next_to_decide == 0  # a duplicate negative is one negative, not the two absence needs
    out = _answer(rec, bookies, reads[0, "b1"])  # 0 and 1 exist: the window slides by two
    assert sorted((c.entry_id, c.bookie) for c in out) == [(e, b) for e in (8, 9) for b in ("b0", "b1", "b2")]
    assert all(c.fence for c in out)
    assert rec.next_to_decide == 2 and len(rec.found) == 2
    assert _answer(rec, bookies, reads[0, "b2"]) == [] and len(rec.found) == 2  # late: entry 0 is decided


def test_read_window_must_be_positive():
    with pytest.raises(BksimError, match="read_window must be >= 1"):
        LedgerRecovery(5, segments=[(0, ["b0"])], write_quorum_size=1, ack_quorum_size=1, rng=random.Random(1),
                       read_window=0)


@pytest.mark.parametrize("window", [1, 64])
def test_round_trips_of_a_long_unconfirmed_tail(window):
    """Every pending read answered once per round (one network round trip): a 2,000-entry unconfirmed tail
    takes 1 fencing round + ceil(2001 / W) read rounds (entry 2,000 is the absent one)."""
    n = 2_000
    bookies = FakeBookies(["b0", "b1", "b2"])
    write(bookies, ["b0", "b1", "b2"], 2, 2, n, lambda s: True)
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=2, ack_quorum_size=2,
                         rng=random.Random(1), read_window=window)
    pending = list(rec.start_recovery())
    rounds = 0
    while rec.phase in (RecoveryPhase.FENCING, RecoveryPhase.READING):
        assert pending and rounds <= n + 2
        rounds += 1
        this_round, pending = pending, []
        for c in this_round:
            pending += _answer(rec, bookies, c)
    assert rec.phase is RecoveryPhase.WRITING_BACK and rec.start == -1 and len(rec.found) == n
    assert rounds == 1 + math.ceil((n + 1) / window)
