"""Recovery and reads with a re-initialised (formatted) bookie in the ensemble (PROTOCOL.md §2.1, §4): its
UNKNOWN_STATE is never counted as absence. The formatted bookie answers first here, every time, which is what a
bookie holding nothing tends to do. With E = Qw = Qa = 2 one explicit negative proves an entry absent, so the
same bookie answering NO_ENTRY (as it did before limbo existed) ends the ledger at -1: the last test shows that
is the hole the rule closes."""
from __future__ import annotations

import random

from bksim.ledger.reader import EntryRead, LacRead
from bksim.ledger.recovery import LedgerRecovery, ReadEntry, RecoveryPhase
from bksim.model.status import StatusCode as S
from unit.ledger.test_recovery import FakeBookies, recover, write

ENSEMBLE = ["b0", "b1"]
ENTRIES = 200  # more than recovery's read window (64): the window slides past its first batch


class FormattedFirst(FakeBookies):
    """b1 was wiped and formatted after the writer died: it holds nothing of ledger 5, and answers what it lacks
    with `answer` (UNKNOWN_STATE for a ledger in limbo). Adds reach it (the write-back) like any bookie."""

    def __init__(self, answer: S) -> None:
        super().__init__(ENSEMBLE)
        self.answer = answer

    def wipe(self, bookie: str) -> None:
        self.data[bookie] = {}
        self.fenced.discard(bookie)
        self.wiped = bookie

    def read(self, read: ReadEntry):
        status, data = super().read(read)
        if read.bookie == self.wiped and status is S.NO_ENTRY:
            return self.answer, b""
        return status, data


def recover_formatted_first(bookies: FormattedFirst) -> tuple[LedgerRecovery, object]:
    """Drive recovery, always delivering the formatted bookie's answers before the others'."""
    rec = LedgerRecovery(5, segments=[(0, list(ENSEMBLE))], write_quorum_size=2, ack_quorum_size=2,
                         rng=random.Random(1))

    class FirstFirst(random.Random):
        def shuffle(self, queue):  # recover() shuffles the command queue: put the wiped bookie's reads first
            queue.sort(key=lambda c: not (isinstance(c, ReadEntry) and c.bookie == bookies.wiped))
    return rec, recover(rec, bookies, rng=FirstFirst())


def written(answer: S) -> tuple[FormattedFirst, list[int]]:
    bookies = FormattedFirst(answer)
    _, acked, _ = write(bookies, ENSEMBLE, 2, 2, ENTRIES, lambda s: True)
    assert acked == list(range(ENTRIES))
    bookies.wipe("b1")
    return bookies, acked


def test_unknown_state_from_a_formatted_bookie_never_truncates_the_ledger():
    bookies, acked = written(S.UNKNOWN_STATE)
    rec, closed = recover_formatted_first(bookies)
    assert closed is not None, rec.failure
    assert closed.last_entry_id == acked[-1]  # b0's NO_ENTRY for entry 200 is the one negative that ends it
    # the writer sent everything before any ack, so every entry piggybacks LAC -1: recovery read all 200 forward
    # (the window slid past its first batch) and wrote them all back, to the formatted bookie too
    assert rec.recovered_lac == -1 and rec.start == -1
    assert sorted(bookies.data["b1"]) == acked


def test_a_formatted_bookie_alone_cannot_decide_anything():
    bookies, _ = written(S.UNKNOWN_STATE)
    bookies.down = {"b0"}  # the only bookie that knows is silent: recovery must fail, not close the ledger
    rec, closed = recover_formatted_first(bookies)
    assert closed is None and rec.phase is RecoveryPhase.FAILED and "coverage" in rec.failure


def test_the_same_bookie_answering_no_entry_would_truncate_every_acknowledged_entry():
    bookies, acked = written(S.NO_ENTRY)
    _, closed = recover_formatted_first(bookies)
    assert closed is not None and closed.last_entry_id == -1 < acked[-1]


def test_a_read_that_gets_only_unknown_state_fails_and_never_says_no_entry():
    read = EntryRead(5, 3, ensemble=("b0", "b1"), write_quorum_size=2)
    asked = read.start()
    asked += read.on_reply(asked[0].bookie, S.UNKNOWN_STATE)
    assert sorted(c.bookie for c in asked) == ["b0", "b1"]  # the other replica is asked next
    read.on_reply(asked[1].bookie, S.UNKNOWN_STATE)
    assert read.entry is None and read.done
    assert "unreadable on every replica" in read.failed and read.failed.count("UNKNOWN_STATE") == 2


def test_unknown_state_does_not_count_for_the_lac_coverage():
    lac = LacRead(("b0", "b1"), write_quorum_size=2, ack_quorum_size=2)
    assert not lac.on_reply("b1", S.UNKNOWN_STATE)  # one window of two, both still unknown: not covered
    assert lac.on_reply("b0", S.OK, 41) and lac.failed is None and lac.lac == 41
