"""TopicChecks (bksim.sim.topic_checks) on its own: CursorNeverRegresses and OrderPerKey around a seek, what a
close of the topic binds the next owner to (AckedNotRedeliveredAfterCleanClose), and what a subscription owes after
seeks and trims (ReceiptedMessagesAreConsumed)."""
from __future__ import annotations

from bksim.sim.bookie_checks import InvariantViolation
from bksim.sim.topic_checks import TopicChecks
from bksim.topics.managed_ledger import LedgerInfo, ManagedLedgerInfo
from bksim.topics.positions import Position as P


def checks() -> tuple[TopicChecks, list[InvariantViolation]]:
    seen: list[InvariantViolation] = []
    return TopicChecks("/ml", {"sh": "Shared"}, False, lambda line: None, seen.append), seen


def test_a_seek_may_lower_the_persisted_mark_delete_any_time_until_it_is_answered():
    """Topics seed 711854: the seek is asked, waits for the cursor's lock behind a persist under way while the
    owner is probed (its persisted mark-delete unchanged), then runs and drops it before it is answered."""
    c, seen = checks()
    c.persisted_mark_delete("sh", P(1, 3), "broker-1#1")
    c.seek_started("sh", P(0, 2))
    c.persisted_mark_delete("sh", P(1, 3), "broker-1#1")   # probed while the seek waits for the lock
    c.persisted_mark_delete("sh", P(1, -1), "broker-1#1")  # the seek runs (its target's ledger was trimmed)
    c.seek_ended("sh")
    c.persisted_mark_delete("sh", P(1, -1), "broker-1#1")
    assert seen == []


def test_after_the_seek_is_answered_a_regression_is_caught_again():
    c, seen = checks()
    c.seek_started("sh", P(0, 2))
    c.seek_ended("sh")
    c.persisted_mark_delete("sh", P(1, 3), "broker-1#1")
    c.persisted_mark_delete("sh", P(1, 1), "broker-2#1")
    assert [v.invariant for v in seen] == ["CursorNeverRegresses"]


def key_shared() -> tuple[TopicChecks, list[InvariantViolation]]:
    seen: list[InvariantViolation] = []
    return TopicChecks("/ml", {"ks": "Key_Shared"}, False, lambda line: None, seen.append), seen


def deliver(c: TopicChecks, ledger: int, entry: int, **kw) -> None:
    c.delivered("ks", "ks-c1", P(ledger, entry), [(("p1", ledger * 10 + entry), "k1")], 0, **kw)


def seek(c: TopicChecks, ledger: int, entry: int) -> None:
    c.seek_started("ks", P(ledger, entry))
    c.seek_ended("ks")


def test_order_per_key_restarts_at_a_seek_back():
    """Topics seed 711924 in miniature: a seek to 3:0 skipped 2:3 (never delivered); after 4:3 of the same key, a
    seek back to 2:1 delivers 2:1, 2:2 again and 2:3 for the first time: in order in the stream it started."""
    c, seen = key_shared()
    deliver(c, 2, 1)
    seek(c, 3, 0)
    deliver(c, 3, 1)
    deliver(c, 4, 3)
    seek(c, 2, 1)
    for ledger, entry in ((2, 1), (2, 2), (2, 3), (3, 1)):
        deliver(c, ledger, entry)
    assert seen == []
    deliver(c, 4, 3)
    deliver(c, 3, 3)  # new, below 4:3 of the same key since the same seek: out of order
    assert [v.invariant for v in seen] == ["OrderPerKey"]


def test_a_delivery_sent_before_a_seek_is_judged_in_the_stream_it_was_sent_in():
    """A delivery in flight when the seek is asked arrives after it: it neither counts against the new stream nor
    escapes the old one's order."""
    c, seen = key_shared()
    deliver(c, 2, 1)
    before = c.seeks("ks")
    seek(c, 2, 0)
    deliver(c, 4, 3, seeks=before)  # sent before the seek
    deliver(c, 2, 2)                # the new stream's first delivery
    assert seen == []
    deliver(c, 3, 0, seeks=before)  # new, below 4:3 in the old stream
    assert [v.invariant for v in seen] == ["OrderPerKey"]


def test_a_close_that_failed_binds_the_next_owner_to_nothing():
    """Topics seeds 722992 and 724645 in miniature: the owner stops cleanly, but its metadata session expires (or its
    ZooKeeper connection is lost) during the close, whose writes all fail; the next owner recovers the last snapshot
    written, from before the ack of 2:1, and delivers 2:1 again: at-least-once, not a violation."""
    c, seen = key_shared()
    deliver(c, 2, 1)
    c.clean_close("ks", {P(2, 1)}, persisted=False)
    deliver(c, 2, 1)
    assert seen == []


def test_a_close_that_persisted_binds_the_next_owner_and_a_later_failed_one_does_not_undo_it():
    c, seen = key_shared()
    deliver(c, 2, 1)
    c.clean_close("ks", {P(2, 1)}, persisted=True)
    deliver(c, 2, 2)
    c.clean_close("ks", {P(2, 1), P(2, 2)}, persisted=False)  # the next close fails: 2:2 may come back, 2:1 not
    deliver(c, 2, 2)
    assert seen == []
    deliver(c, 2, 1)
    assert [v.invariant for v in seen] == ["AckedNotRedeliveredAfterCleanClose"]


def ledgers(c: TopicChecks, *ids: int) -> None:
    """The owner writes the managed-ledger list `ids` (closed ledgers of 10 entries, the last one open)."""
    infos = [LedgerInfo(i, 10, closed_ms=1) for i in ids[:-1]] + [LedgerInfo(ids[-1])]
    c.ml_written(ManagedLedgerInfo(infos).to_bytes(), "broker-1#1")


def shared_with_a_delayed_message() -> tuple[TopicChecks, list[InvariantViolation]]:
    """sh got 0:4, 0:5 and 1:0; p2's 0:6 (a delayed message) was not due yet."""
    c, seen = checks()
    ledgers(c, 0, 1, 2)
    for pos, m in ((P(0, 4), ("p1", 1)), (P(0, 5), ("p1", 2)), (P(0, 6), ("p2", 3)), (P(1, 0), ("p2", 6))):
        c.receipt(m, pos, "broker-1#1")
        if m != ("p2", 3):
            c.delivered("sh", "sh-c1", pos, [(m, None)], 0)
    return c, seen


def seek_sh(c: TopicChecks, ledger: int, entry: int) -> None:
    c.seek_started("sh", P(ledger, entry))
    c.seek_ended("sh")


def test_a_seek_back_into_a_trimmed_ledger_does_not_owe_what_an_earlier_seek_skipped_there():
    """Topics seed 756099 in miniature: a seek to 1:0 skips 0:6 (a delayed message not due yet); every cursor is past
    ledger 0 and it is trimmed; a seek back to 0:4 starts at the topic's first entry (1:0): 0:6 is not in the topic
    any more, it is not owed (checker defect: SubscriptionsDrain waited for it)."""
    c, seen = shared_with_a_delayed_message()
    seek_sh(c, 1, 0)
    assert c.missing("sh") == []
    ledgers(c, 1, 2)  # ledger 0 trimmed
    seek_sh(c, 0, 4)
    assert c.missing("sh") == []
    assert seen == []


def test_a_seek_back_owes_what_it_passes_over_in_the_topic_even_if_trimmed_later():
    """The seek back to 0:4 comes before ledger 0 is trimmed: the cursor must deliver 0:6 before ledger 0 may go."""
    c, seen = shared_with_a_delayed_message()
    seek_sh(c, 1, 0)
    seek_sh(c, 0, 4)
    ledgers(c, 1, 2)
    assert c.missing("sh") == [("p2", 3)]


def test_a_message_trimmed_while_it_was_owed_stays_owed_after_a_seek_back():
    """0:6 was owed (no seek had skipped it) when ledger 0 was trimmed: a later seek back does not excuse it."""
    c, seen = shared_with_a_delayed_message()
    ledgers(c, 1, 2)
    seek_sh(c, 0, 4)
    assert c.missing("sh") == [("p2", 3)]


def test_a_trim_while_a_seek_back_is_under_way_owes_nothing_the_seek_in_force_had_skipped():
    """The seek back to 0:4 is asked; ledger 0 is trimmed before the broker applies it (the cursor still had 0:6
    skipped by the seek to 1:0): the seek then starts at 1:0, and 0:6 is not owed."""
    c, seen = shared_with_a_delayed_message()
    seek_sh(c, 1, 0)
    c.seek_started("sh", P(0, 4))
    ledgers(c, 1, 2)
    c.seek_ended("sh")
    assert c.missing("sh") == []
