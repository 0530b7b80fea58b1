"""TopicChecks (bksim.sim.topic_checks) on its own: CursorNeverRegresses and OrderPerKey around a seek, what a
close of the topic binds the next owner to (AckedNotRedeliveredAfterCleanClose), what a subscription owes after
seeks, trims and a message TTL (ReceiptedMessagesAreConsumed), and that nothing expires before its time
(ExpiredOnlyWhenOld)."""
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


# -- a message TTL: what expired is not owed, and nothing expires before its time ---------------------------------
TTL_MS = 100


def with_ttl(ttl_ms: int = TTL_MS) -> tuple[TopicChecks, list[InvariantViolation]]:
    """sh and ex; p1's Sends 1..3 made at 0, 10 and 20 ms, stored at 0:1..0:3; sh got 0:1 only, ex all three."""
    seen: list[InvariantViolation] = []
    c = TopicChecks("/ml", {"sh": "Shared", "ex": "Exclusive"}, False, lambda line: None, seen.append,
                    expiry_ms=ttl_ms)
    for seq in (1, 2, 3):
        m = ("p1", seq)
        c.send_made(m, (m,), at_ms=10.0 * (seq - 1))
        c.receipt(m, P(0, seq), "broker-1#1")
        c.delivered("ex", "ex-c1", P(0, seq), [(m, None)], 0)
    c.delivered("sh", "sh-c1", P(0, 1), [(("p1", 1), None)], 0)
    return c, seen


def test_messages_the_mark_delete_passed_after_their_ttl_are_expired_not_lost():
    c, seen = with_ttl()
    assert c.missing("sh") == [("p1", 2), ("p1", 3)]
    c.mark_delete_seen("sh", P(0, 1), 60.0)      # acked
    c.mark_delete_seen("sh", P(0, 3), 150.0)     # expired: 0:2 and 0:3 made at 10 and 20 ms
    c.mark_delete_seen("sh", P(0, 2), 200.0)     # lower again (a restore): the first time seen past counts
    assert c.missing("sh") == []
    c.final()
    assert seen == [] and c.stats["expired"] == 2


def test_a_mark_delete_past_a_message_before_its_ttl_ran_out_is_caught():
    c, seen = with_ttl()
    c.mark_delete_seen("sh", P(0, 3), 115.0)     # 0:3 was made at 20 ms: it could expire after 120 ms at the earliest
    assert c.missing("sh") == []
    c.final()
    assert [v.invariant for v in seen] == ["ExpiredOnlyWhenOld"]
    assert "p1/3" in seen[0].detail


def test_without_a_ttl_a_mark_delete_past_an_undelivered_message_is_a_loss():
    c, seen = with_ttl(ttl_ms=0)
    c.mark_delete_seen("sh", P(0, 3), 500.0)
    assert c.missing("sh") == [("p1", 2), ("p1", 3)]
    c.final()
    assert [v.invariant for v in seen] == ["ReceiptedMessagesAreConsumed"]


def test_what_the_mark_delete_passed_before_a_seek_back_is_owed_again():
    c, seen = with_ttl()
    c.mark_delete_seen("sh", P(0, 3), 150.0)
    c.seek_started("sh", P(0, 1))
    c.mark_delete_seen("sh", P(0, 3), 160.0)     # under way: may be the mark-delete from before the seek
    assert c.missing("sh") == [("p1", 2), ("p1", 3)]
    c.seek_ended("sh")
    c.mark_delete_seen("sh", P(0, 2), 300.0)     # expired again after the seek: 0:2 only
    assert c.missing("sh") == [("p1", 3)]


def test_a_copy_every_subscription_let_expire_unseen_is_not_looked_for_at_its_receipts_position():
    """Dedup off: p1's Send 2 was stored at 0:2 and again at 0:4 (the receipt names 0:4); ex got it at 0:2, and the
    copy at 0:4 expired everywhere before anyone got it."""
    c, seen = with_ttl()
    c.receipt(("p1", 2), P(0, 4), "broker-1#1")
    for sub in ("sh", "ex"):
        c.mark_delete_seen(sub, P(0, 4), 150.0)
    c.final()
    assert seen == []


def test_a_copy_at_the_receipts_position_that_expired_too_early_everywhere_is_caught():
    c, seen = with_ttl()
    c.receipt(("p1", 2), P(0, 4), "broker-1#1")
    for sub in ("sh", "ex"):
        c.mark_delete_seen(sub, P(0, 4), 105.0)   # Send 2 was made at 10 ms
    c.final()
    assert [v.invariant for v in seen] == ["ExpiredOnlyWhenOld"]


def test_a_copy_at_the_receipts_position_that_one_subscription_still_owes_is_not_where_consumers_found_it():
    c, seen = with_ttl()
    c.receipt(("p1", 2), P(0, 4), "broker-1#1")
    c.mark_delete_seen("sh", P(0, 4), 150.0)      # ex's mark-delete never passed 0:4, and ex never got it there
    c.final()
    assert [v.invariant for v in seen] == ["ReceiptNamesItsPosition"]


def test_a_send_answered_only_as_a_duplicate_and_never_seen_expired_before_the_producers_next_send():
    """Dedup: p1's Send 4 (made at 30 ms) got only a "duplicate" receipt and no one saw where it is; Send 5 is at
    0:6. A mark-delete past 0:6 passed Send 4 too (a producer's Sends are stored in order), no later than it was
    seen there."""
    c, seen = with_ttl()
    for seq, pos in ((4, None), (5, P(0, 6))):
        m = ("p1", seq)
        c.send_made(m, (m,), at_ms=10.0 * (seq - 1))
        c.receipt(m, pos, "broker-1#1")
        if pos is not None:
            c.delivered("sh", "sh-c1", pos, [(m, None)], 0)
            c.delivered("ex", "ex-c1", pos, [(m, None)], 0)
    for sub in ("sh", "ex"):
        c.mark_delete_seen(sub, P(0, 5), 125.0)  # before 0:6: where Send 4 is, no one knows
    assert ("p1", 4) in c.missing("sh")
    for sub in ("sh", "ex"):
        c.mark_delete_seen(sub, P(0, 6), 200.0)
    assert c.missing("sh") == [] and c.missing("ex") == []
    c.final()
    assert seen == []


def test_a_send_answered_only_as_a_duplicate_that_expired_too_early_is_caught():
    c, seen = with_ttl()
    for seq, pos in ((4, None), (5, P(0, 6))):
        m = ("p1", seq)
        c.send_made(m, (m,), at_ms=10.0 * (seq - 1))
        c.receipt(m, pos, "broker-1#1")
        c.delivered("ex", "ex-c1", pos or P(0, 4), [(m, None)], 0)
    c.mark_delete_seen("sh", P(0, 6), 125.0)  # Send 4 was made at 30 ms: at or before 130 ms is too early
    c.final()
    assert [v.invariant for v in seen] == ["ExpiredOnlyWhenOld"] and "p1/4" in seen[0].detail


def test_a_message_that_could_have_expired_may_come_back_below_one_delivered_after_it():
    """Topics seed 864455 in miniature (Failover, TTL): ex got 0:1 and then 0:3 at 125 ms, the cursor having passed
    0:2 (made at 10 ms) by expiry; the owner crashed before persisting that, and the next one delivers 0:2 for the
    first time. Had 0:3 come at 105 ms, 0:2 could not have expired yet."""
    for arrived_ms, caught in ((125.0, []), (105.0, ["OrderOnExclusive"])):
        seen: list[InvariantViolation] = []
        c = TopicChecks("/ml", {"ex": "Exclusive"}, False, lambda line: None, seen.append, expiry_ms=TTL_MS)
        for seq in (1, 2, 3):
            c.send_made(("p1", seq), (("p1", seq),), at_ms=10.0 * (seq - 1))
        c.delivered("ex", "ex-c1", P(0, 1), [(("p1", 1), None)], 0, at_ms=50.0)
        c.delivered("ex", "ex-c1", P(0, 3), [(("p1", 3), None)], 0, at_ms=arrived_ms)
        c.delivered("ex", "ex-c2", P(0, 2), [(("p1", 2), None)], 0, at_ms=300.0)
        assert [v.invariant for v in seen] == caught, arrived_ms
