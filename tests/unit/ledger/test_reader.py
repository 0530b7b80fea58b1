"""Readers: LAC under quorum coverage, entry reads with failover and speculative reads."""
from __future__ import annotations

from bksim.formats.entry import encode_entry
from bksim.ledger.reader import EntryRead, LacRead, ReadEntry, ReadLac
from bksim.model.status import StatusCode as S

ENSEMBLE = ("b0", "b1", "b2")


def test_lac_is_the_highest_reported_once_coverage_holds():
    r = LacRead(ENSEMBLE, 3, 2)
    assert r.start() == [ReadLac("b0"), ReadLac("b1"), ReadLac("b2")]
    assert not r.on_reply("b0", S.OK, 4)
    assert r.on_reply("b1", S.OK, 6)  # one unknown < Qa in every window: decided
    assert (r.lac, r.failed) == (6, None)


def test_lac_read_fails_without_coverage():
    r = LacRead(ENSEMBLE, 3, 2)
    r.on_reply("b0", S.OK, 4)
    r.on_reply("b1", None)
    assert r.on_reply("b2", S.IO_ERROR)
    assert r.failed and "coverage" in r.failed


def entry(entry_id, payload=b"x"):
    return encode_entry(9, entry_id, entry_id - 1, 1, payload)


def test_entry_read_fails_over_on_errors_and_bad_digests():
    r = EntryRead(9, 1, ENSEMBLE, 3)
    assert r.start() == [ReadEntry("b1", 1)]  # write set of entry 1: b1, b2, b0
    assert r.on_reply("b1", S.IO_ERROR) == [ReadEntry("b2", 1)]
    bad = entry(1)[:-1] + b"y"
    assert r.on_reply("b2", S.OK, bad) == [ReadEntry("b0", 1)]
    assert r.on_reply("b0", S.OK, entry(1)) == []
    assert r.done and r.entry.payload == b"x"


def test_a_wrong_entry_is_a_bad_replica_not_an_answer():
    r = EntryRead(9, 1, ENSEMBLE, 2)
    r.start()
    assert r.on_reply("b1", S.OK, entry(2)) == [ReadEntry("b2", 1)]
    assert not r.done


def test_speculative_read_asks_the_next_replica_and_the_first_valid_reply_wins():
    r = EntryRead(9, 0, ENSEMBLE, 3)
    assert r.start() == [ReadEntry("b0", 0)]
    assert r.on_speculative_timeout() == [ReadEntry("b1", 0)]
    assert r.on_reply("b1", S.OK, entry(0)) == [] and r.done
    assert r.on_reply("b0", S.OK, entry(0)) == []  # late


def test_every_replica_failing_is_reported_never_a_no():
    r = EntryRead(9, 0, ENSEMBLE, 2)
    r.start()
    r.on_reply("b0", S.NO_ENTRY)
    r.on_reply("b1", None)
    assert r.done and r.entry is None and "unreadable on every replica" in r.failed
    assert "NO_ENTRY" in r.failed and "timeout" in r.failed
