"""Ledger recovery (sans-I/O) against in-memory bookies with fencing: scripted cases, then seeded random
histories (a writer that dies mid-stream, bookies that do not answer) checked against the §7 invariants."""
from __future__ import annotations

import random

import pytest

from bksim.formats.entry import decode_entry
from bksim.ledger.quorum import write_set_indexes
from bksim.ledger.recovery import LedgerRecovery, ReadEntry, RecoveryFailed, RecoveryPhase
from bksim.ledger.writer import Acknowledge, CloseLedger, LedgerWriter, SendAdd, UpdateEnsemble, WriterState
from bksim.model.invariants import InvariantError
from bksim.model.status import StatusCode as S


class FakeBookies:
    """In-memory bookies for unit tests: entries, fencing, RECOVERY_ADD, and bookies that do not answer."""

    def __init__(self, names):
        self.data = {b: {} for b in names}
        self.fenced: set[str] = set()
        self.down: set[str] = set()

    def add(self, send: SendAdd):
        if send.bookie in self.down:
            return None
        if send.bookie in self.fenced and not send.recovery:
            return S.FENCED
        self.data[send.bookie][send.entry_id] = send.entry
        return S.OK

    def read(self, read: ReadEntry):
        if read.bookie in self.down:
            return None, b""
        if read.fence:
            self.fenced.add(read.bookie)
        entries = self.data[read.bookie]
        entry_id = max(entries) if read.entry_id == -1 and entries else read.entry_id
        if entry_id in entries:
            return S.OK, entries[entry_id]
        return S.NO_ENTRY, b""


def recover(rec: LedgerRecovery, bookies: FakeBookies, rng: random.Random | None = None, segments=None):
    """Drive recovery to the end, answering its commands in (optionally shuffled) order; ensemble changes of
    the write-back are applied to `segments` (the metadata as the shell would CAS it)."""
    segments = rec.segments if segments is None else segments
    writable = [b for b in sorted(bookies.data) if b not in bookies.down]
    queue = list(rec.start_recovery())
    closed = None
    while queue:
        if rng is not None:
            rng.shuffle(queue)
        c = queue.pop(0)
        if isinstance(c, ReadEntry):
            status, data = bookies.read(c)
            queue += rec.on_read_result(c.bookie, c.entry_id, status, data)
        elif isinstance(c, SendAdd):
            assert c.recovery
            queue += rec.forward(rec.writer.on_add_result(c.entry_id, c.bookie, bookies.add(c), writable))
        elif isinstance(c, UpdateEnsemble):
            if segments[-1][0] == c.first_entry_id:
                segments[-1] = (c.first_entry_id, c.ensemble)
            else:
                segments.append((c.first_entry_id, c.ensemble))
            queue += rec.forward(rec.writer.on_ensemble_changed(c.first_entry_id, c.ensemble))
        elif isinstance(c, CloseLedger):
            closed = c
            rec.on_closed()
        elif isinstance(c, RecoveryFailed):
            return None
    return closed


def write(bookies: FakeBookies, ensemble, qw, qa, n, deliver):
    """A writer appends n entries; `deliver(send)` decides which adds reach their bookie. Returns (writer,
    acknowledged ids, undelivered sends)."""
    w = LedgerWriter(5, ensemble=ensemble, segment_first_entry_id=0, write_quorum_size=qw, ack_quorum_size=qa,
                     rng=random.Random(0))
    acked, undelivered, sends = [], [], []
    for i in range(n):
        sends += [c for c in w.append(f"payload-{i}".encode()) if isinstance(c, SendAdd)]
    for send in sends:
        if deliver(send):
            for c in w.on_add_result(send.entry_id, send.bookie, bookies.add(send)):
                if isinstance(c, Acknowledge):
                    acked.append(c.entry_id)
        else:
            undelivered.append(send)
    return w, acked, undelivered


def test_recovery_closes_at_the_last_entry_that_may_have_been_acknowledged():
    b = FakeBookies(["b0", "b1", "b2"])
    # entries 0..4 reach everyone; 5 reaches only b0 (not acknowledged, Qa=2, but recovery cannot know: it
    # finds a verified copy and keeps it); 6 reaches nobody
    w, acked, _ = write(b, ["b0", "b1", "b2"], 3, 2, 7,
                        lambda s: s.entry_id < 5 or (s.entry_id == 5 and s.bookie == "b0"))
    assert acked == [0, 1, 2, 3, 4]
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=3, ack_quorum_size=2,
                         rng=random.Random(1))
    closed = recover(rec, b)
    assert closed == CloseLedger(5, sum(len(f"payload-{i}") for i in range(6)))
    # every entry was sent before any ack came back, so each piggybacks LAC -1: recovery reads forward from 0
    assert rec.recovered_lac == -1 and rec.start == -1
    assert all(5 in b.data[x] and b.data[x][5] == b.data["b0"][5] for x in ("b1", "b2"))  # written back verbatim


def test_absence_needs_qw_minus_qa_plus_one_negatives_and_write_back_replaces_a_silent_bookie():
    b = FakeBookies(["b0", "b1", "b2", "b3"])
    write(b, ["b0", "b1", "b2"], 3, 2, 3, lambda s: True)
    b.down = {"b2"}  # answers nothing: coverage still holds (1 unknown < Qa in every window)
    segments = [(0, ("b0", "b1", "b2"))]
    rec = LedgerRecovery(5, segments=segments, write_quorum_size=3, ack_quorum_size=2, rng=random.Random(1))
    closed = recover(rec, b, segments=segments)
    # entry 3: b0 and b1 say NO_ENTRY = Qw - Qa + 1 negatives: absent. The write-back of 0..2 replaces the
    # silent b2 by b3 (an ensemble change during recovery) and the ledger closes at 2
    assert closed is not None and closed.last_entry_id == 2
    first, ensemble = segments[-1]
    assert ensemble == ("b0", "b1", "b3") and all(i in b.data["b3"] for i in range(first, 3))


def test_too_many_silent_bookies_fail_recovery_instead_of_guessing():
    b = FakeBookies(["b0", "b1", "b2"])
    write(b, ["b0", "b1", "b2"], 3, 2, 3, lambda s: True)
    b.down = {"b1", "b2"}
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=3, ack_quorum_size=2,
                         rng=random.Random(1))
    assert recover(rec, b) is None
    assert rec.phase is RecoveryPhase.FAILED and "coverage" in rec.failure


def test_unauthorized_aborts():
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=3, ack_quorum_size=2,
                         rng=random.Random(1))
    rec.start_recovery()
    [failed] = rec.on_read_result("b0", -1, S.UNAUTHORIZED)
    assert isinstance(failed, RecoveryFailed) and "UNAUTHORIZED" in failed.reason


def test_every_recovery_read_fences():
    b = FakeBookies(["b0", "b1", "b2"])
    write(b, ["b0", "b1", "b2"], 2, 2, 4, lambda s: True)
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=2, ack_quorum_size=2,
                         rng=random.Random(1))
    reads = []
    queue = list(rec.start_recovery())
    while queue:
        c = queue.pop(0)
        if isinstance(c, ReadEntry):
            reads.append(c)
            status, data = b.read(c)
            queue += rec.on_read_result(c.bookie, c.entry_id, status, data)
        elif isinstance(c, SendAdd):
            queue += rec.forward(rec.writer.on_add_result(c.entry_id, c.bookie, b.add(c)))
        elif isinstance(c, CloseLedger):
            rec.on_closed()
    assert any(r.entry_id >= 0 for r in reads) and all(r.fence for r in reads)


def test_a_corrupt_replica_is_not_a_reply():
    b = FakeBookies(["b0", "b1", "b2"])
    write(b, ["b0", "b1", "b2"], 3, 2, 2, lambda s: True)
    good = b.data["b1"][1]
    b.data["b0"][1] = good[:-1] + bytes([good[-1] ^ 1])  # digest mismatch on one replica
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=3, ack_quorum_size=2,
                         rng=random.Random(1))
    closed = recover(rec, b, random.Random(3))
    assert closed is not None and closed.last_entry_id == 1


@pytest.mark.parametrize("seed", range(300))
def test_random_histories_keep_the_invariants(seed):
    rng = random.Random(seed)
    e = rng.randint(1, 5)
    qw = rng.randint(1, e)
    qa = rng.randint(1, qw)
    names = [f"b{i}" for i in range(e)]
    b = FakeBookies(names + [f"spare{i}" for i in range(rng.randint(0, 2))])
    n = rng.randint(0, 12)
    cut = rng.random()
    writer, acked, undelivered = write(b, names, qw, qa, n, lambda s: rng.random() < cut)
    b.down = {x for x in names if rng.random() < 0.15}
    segments = [(0, tuple(names))]
    rec = LedgerRecovery(5, segments=segments, write_quorum_size=qw, ack_quorum_size=qa, rng=rng)
    closed = recover(rec, b, rng, segments)
    if closed is None:  # recovery may refuse, never guess: only when bookies were silent
        assert b.down, rec.failure
        return
    last = closed.last_entry_id
    assert all(a <= last for a in acked)  # NoDivergenceBetweenClientAndMetaData
    for entry_id in range(last + 1):  # AllCommittedEntriesReachAckQuorum + NoLogDivergence
        ensemble = max((s for s in segments if s[0] <= entry_id), key=lambda s: s[0])[1]
        holders = [ensemble[i] for i in write_set_indexes(entry_id, e, qw) if entry_id in b.data[ensemble[i]]]
        assert len(holders) >= qa, (seed, entry_id, holders)
        copies = {b.data[h][entry_id] for h in holders}
        assert len(copies) == 1
        assert decode_entry(copies.pop(), ledger_id=5, entry_id=entry_id).payload == f"payload-{entry_id}".encode()
    if last >= 0:
        some = next(h for h in sorted(b.data) if last in b.data[h])
        assert closed.length == decode_entry(b.data[some][last]).ledger_length
    # FencedWriterMakesNoProgress: the old writer's late adds get no acknowledgement above last_entry_id
    b.down = set()
    for send in undelivered:
        for c in writer.on_add_result(send.entry_id, send.bookie, b.add(send), writable_bookies=sorted(b.data)):
            assert not (isinstance(c, Acknowledge) and c.entry_id > last), (seed, c, last)
    assert writer.last_add_confirmed <= last or writer.state is WriterState.FAILED


# -- the two defects found by the TLA+ specification of the protocol (each test fails without its rule) ------
def _old_writer_entry_0_acked_by_b0_only(b: FakeBookies):
    """E=3, Qw=3, Qa=2: the old writer sent entry 0 to everyone; only b0 has received it so far."""
    w = LedgerWriter(5, ensemble=["b0", "b1", "b2"], segment_first_entry_id=0, write_quorum_size=3,
                     ack_quorum_size=2, rng=random.Random(0))
    sends = {s.bookie: s for s in w.append(b"late") if isinstance(s, SendAdd)}
    assert w.on_add_result(0, "b0", b.add(sends["b0"])) == []
    return w, sends


def _recovery_with_b2_fence_lost(fence_reads: bool):
    b = FakeBookies(["b0", "b1", "b2"])
    w, sends = _old_writer_entry_0_acked_by_b0_only(b)
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=3, ack_quorum_size=2,
                         rng=random.Random(1), fence_reads=fence_reads)
    fence_reads_sent = {c.bookie: c for c in rec.start_recovery()}
    commands = []
    for bookie in ("b0", "b1"):  # b2's fencing read is lost: coverage holds with b2 unknown
        status, data = b.read(fence_reads_sent[bookie])
        commands += rec.on_read_result(bookie, -1, status, data)
    reads = {c.bookie: c for c in commands if isinstance(c, ReadEntry) and c.entry_id == 0}
    assert set(reads) == {"b0", "b1", "b2"}  # (the reads of entries 1, 2, ... of the read window stay unanswered)
    closed = None
    for bookie in ("b1", "b2"):  # b0's answer (it has entry 0) is slow: two negatives arrive first
        status, data = b.read(reads[bookie])
        for c in rec.on_read_result(bookie, 0, status, data):
            if isinstance(c, CloseLedger):
                closed = c
    assert closed == CloseLedger(-1, 0)  # Qw - Qa + 1 = 2 negatives: entry 0 is absent
    # now the old writer's add of entry 0 reaches b2
    late = [c for c in w.on_add_result(0, "b2", b.add(sends["b2"])) if isinstance(c, Acknowledge)]
    return closed, late


def test_tla_recovery_reads_must_fence():
    closed, late = _recovery_with_b2_fence_lost(fence_reads=True)
    assert late == []  # b2 was fenced by the recovery read: the old writer cannot reach Qa


def test_tla_recovery_reads_that_do_not_fence_let_the_old_writer_diverge():
    closed, late = _recovery_with_b2_fence_lost(fence_reads=False)
    assert late == [Acknowledge(0)] and late[0].entry_id > closed.last_entry_id  # NoDivergence broken


def _recovery_after_an_ensemble_change(start_rule: bool):
    """Entries 0..4 on b0, b1, b2 and confirmed (LAC 4); then b0 and b1 failed and the writer changed the
    ensemble to b3, b4, b2 from entry 5, and died before writing there. Fencing reaches coverage on the
    answers of b3 and b4 (nothing stored): no piggybacked LAC is seen, the recovered LAC is -1."""
    b = FakeBookies(["b0", "b1", "b2", "b3", "b4"])
    w = LedgerWriter(5, ensemble=["b0", "b1", "b2"], segment_first_entry_id=0, write_quorum_size=3,
                     ack_quorum_size=2, rng=random.Random(0))
    for i in range(5):
        for c in w.append(f"payload-{i}".encode()):
            w.on_add_result(c.entry_id, c.bookie, b.add(c))
    assert w.last_add_confirmed == 4
    segments = [(0, ("b0", "b1", "b2")), (5, ("b3", "b4", "b2"))]
    b.down = {"b0", "b1"}
    rec = LedgerRecovery(5, segments=segments, write_quorum_size=3, ack_quorum_size=2, rng=random.Random(1),
                         start_rule=start_rule)
    closed = recover(rec, b, segments=segments)
    return rec, closed


def test_tla_recovery_never_starts_below_the_last_segment():
    rec, closed = _recovery_after_an_ensemble_change(start_rule=True)
    assert rec.recovered_lac == -1 and rec.start == 4  # the last segment starts at 5: entry 4 is confirmed
    assert closed == CloseLedger(4, sum(len(f"payload-{i}") for i in range(5)))


def test_tla_recovery_starting_below_the_last_segment_truncates_a_confirmed_entry():
    rec, closed = _recovery_after_an_ensemble_change(start_rule=False)
    # read-forward from entry 0 in the last segment's ensemble finds nothing there: the confirmed entries
    # 0..4 are truncated (NoDivergence broken)
    assert closed is not None and closed.last_entry_id < 4


def _reading(rec, bookies):
    """Answer the fencing reads: the recovery is then READING with its window of reads out."""
    for c in rec.start_recovery():
        status, data = bookies.read(c)
        rec.on_read_result(c.bookie, c.entry_id, status, data)
    assert rec.phase is RecoveryPhase.READING
    return rec


@pytest.mark.parametrize("done, corrupt, invariant", [
    (False, lambda rec: rec._reads.pop(rec.next_to_decide), "WindowBounded"),
    (False, lambda rec: setattr(rec, "start", rec.recovered_lac - 1), "StartRule"),
    (False, lambda rec: rec.found.append((b"", 0)), "FoundInOrder"),
    (True, lambda rec: setattr(rec, "phase", RecoveryPhase.READING), "PhaseOrder"),
    (True, lambda rec: rec.found.append(rec.found[-1]), "WriteBackMatchesFound"),
    (True, lambda rec: setattr(rec.writer, "last_add_confirmed", rec.writer.last_add_pushed + 1), "LacBelowLap")])
def test_check_invariants_catches_a_corrupted_recovery(done, corrupt, invariant):
    b = FakeBookies(["b0", "b1", "b2"])
    write(b, ["b0", "b1", "b2"], 3, 2, 6, lambda s: True)
    rec = LedgerRecovery(5, segments=[(0, ["b0", "b1", "b2"])], write_quorum_size=3, ack_quorum_size=2,
                         rng=random.Random(1), read_window=2)
    if done:
        assert recover(rec, b) is not None and rec.phase is RecoveryPhase.DONE and rec.found
    else:
        _reading(rec, b)
    rec.check_invariants()
    corrupt(rec)
    with pytest.raises(InvariantError, match=f"invariant {invariant} broken") as caught:
        rec.check_invariants()
    assert caught.value.invariant == invariant and "ledger 5" in str(caught.value)
